package proxy

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/idemproxy/idemproxy"
)

// Fingerprint hashes what makes two requests the same command: method,
// path, raw query and the body bytes as received. Each part is length
// prefixed, so no two different requests share an encoding.
func Fingerprint(method, path, rawQuery string, body []byte) idemproxy.Fingerprint {
	h := sha256.New()
	var n [8]byte
	for _, part := range [...]string{method, path, rawQuery} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	binary.BigEndian.PutUint64(n[:], uint64(len(body)))
	h.Write(n[:])
	h.Write(body)
	var fp idemproxy.Fingerprint
	h.Sum(fp[:0])
	return fp
}
