package idempotency

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// StatusSet is a set of HTTP status codes between 200 and 599: the
// upstream answers that make a record (Config.SuccessStatus). Its zero
// value is empty; Config treats an empty set as 2xx.
type StatusSet struct {
	bits [10]uint64 // bit c%64 of word c/64 is status c
}

// ParseStatusSet reads a comma-separated list of status codes (303) and
// classes (2xx), such as "2xx,303". Codes and classes must lie between 200
// and 599; letter case and spaces around items do not matter.
func ParseStatusSet(s string) (StatusSet, error) {
	var set StatusSet
	for _, item := range strings.Split(s, ",") {
		item = strings.ToLower(strings.TrimSpace(item))
		if item == "" {
			continue
		}
		if len(item) == 3 && item[1:] == "xx" && item[0] >= '2' && item[0] <= '5' {
			base := int(item[0]-'0') * 100
			for c := base; c < base+100; c++ {
				set.add(c)
			}
			continue
		}
		code, err := strconv.Atoi(item)
		if err != nil || len(item) != 3 || code < 200 || code > 599 {
			return StatusSet{}, fmt.Errorf("%q is neither a status code from 200 to 599 (e.g. 303) nor a class from 2xx to 5xx", item)
		}
		set.add(code)
	}
	if set.empty() {
		return StatusSet{}, errors.New("lists no status (want e.g. 2xx or 2xx,303)")
	}
	return set, nil
}

func (s *StatusSet) add(code int) { s.bits[code/64] |= 1 << (code % 64) }

func (s StatusSet) empty() bool { return s == StatusSet{} }

// Contains reports whether code is in the set.
func (s StatusSet) Contains(code int) bool {
	return code >= 0 && code < 64*len(s.bits) && s.bits[code/64]&(1<<(code%64)) != 0
}
