// Package fakeclock is the settable clock of idemproxy's tests: stores
// and caches that take a Now func get Clock.Now, and a test moves time
// with Advance instead of sleeping.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that stands still until Advance moves it. It is safe
// for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock that reads start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
