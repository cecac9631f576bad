// Package memstat measures the live heap for tests and benchmarks that
// assert or report memory figures.
package memstat

import "runtime"

// LiveHeap returns HeapAlloc once garbage is collected (twice, so objects
// freed by finalizers are gone too): the bytes still reachable.
func LiveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
