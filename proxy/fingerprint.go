package proxy

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"

	"github.com/idemproxy/idemproxy"
)

// scratch holds the buffers Fingerprint lays its input out in, so that
// hashing allocates nothing on the request path.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// Fingerprint hashes what makes two requests the same command: method,
// path, raw query and the body bytes as received. Each part is length
// prefixed, so no two different requests share an encoding.
func Fingerprint(method, path, rawQuery string, body []byte) idemproxy.Fingerprint {
	bp := scratch.Get().(*[]byte)
	b := (*bp)[:0]
	for _, part := range [...]string{method, path, rawQuery} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(part)))
		b = append(b, part...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	b = append(b, body...)
	fp := idemproxy.Fingerprint(sha256.Sum256(b))
	if cap(b) <= 64<<10 { // don't keep large bodies' buffers around
		*bp = b
		scratch.Put(bp)
	}
	return fp
}
