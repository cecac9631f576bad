package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// scratch holds the buffers Fingerprint lays its input out in, so that
// hashing allocates nothing on the request path.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// digests are the SHA-256 states that hash large bodies in place.
var digests = sync.Pool{New: func() any { return sha256.New() }}

// scratchMax is the largest scratch buffer kept; a larger input is hashed
// without being copied.
const scratchMax = 64 << 10

// Fingerprint hashes what makes two requests the same command: method,
// path (escaped, as the upstream receives it), raw query and the body
// bytes as received. Each part is length prefixed, so no two different
// requests share an encoding.
func Fingerprint(method, path, rawQuery string, body []byte) idemproxy.Fingerprint {
	bp := scratch.Get().(*[]byte)
	b := (*bp)[:0]
	for _, part := range [...]string{method, path, rawQuery} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(part)))
		b = append(b, part...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	var fp idemproxy.Fingerprint
	if len(b)+len(body) <= scratchMax {
		b = append(b, body...)
		fp = sha256.Sum256(b)
	} else {
		fp = hashInPlace(b, body)
	}
	if cap(b) <= scratchMax {
		*bp = b
		scratch.Put(bp)
	}
	return fp
}

// hashInPlace hashes prefix then body without copying body.
func hashInPlace(prefix, body []byte) idemproxy.Fingerprint {
	h := digests.Get().(hash.Hash)
	h.Reset()
	h.Write(prefix)
	h.Write(body)
	var sum idemproxy.Fingerprint
	h.Sum(sum[:0])
	digests.Put(h)
	return sum
}

// commandType is "METHOD /path", at most MaxCommandTypeLen bytes.
func commandType(method, path string) string {
	return cutCommandType(method + " " + path)
}

func newCommandID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.New()
	}
	return id
}
