//go:build race

package idempotency_test

// The race detector multiplies a process's memory: figures measured under
// it say nothing about the code.
func init() { raceDetector = true }
