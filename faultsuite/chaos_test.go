//go:build fault

package faultsuite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// fault is one injected failure, as the report and the attribution of
// duplicates see it.
type fault struct {
	Kind  string    `json:"kind"`
	Slot  int       `json:"slot"`  // -1: every replica
	Start time.Time `json:"start"` // for a kill: when the signal was sent
	End   time.Time `json:"end"`
	// Restarted is when the killed replica's successor was launched: any
	// request the upstream received from that slot between Start and
	// Restarted was sent by the killed process.
	Restarted time.Time `json:"restarted,omitzero"`
	Detail    string    `json:"detail,omitempty"`
}

// chaos injects faults one after another, with calm in between, until its
// context ends; every step restores what it broke before returning.
type chaos struct {
	slots    []*slot
	up       *upstream
	killable []int // slots it may SIGKILL
	rng      *rand.Rand
	calm     time.Duration
	logf     func(format string, args ...any)

	mu      sync.Mutex
	faults  []fault
	errs    []error
	killIdx int
}

func (c *chaos) record(f fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults = append(c.faults, f)
}

func (c *chaos) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

func (c *chaos) faultList() []fault {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]fault(nil), c.faults...)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *chaos) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)+1))
}

func (c *chaos) run(ctx context.Context) {
	// The bounded run gets through the first dozen or so; the soak
	// repeats the whole list many times.
	steps := []func(context.Context){
		c.killInFlight,
		c.storeCutOne,
		c.upstreamMode(modeSlow, 2*time.Second),
		c.storeCutAll,
		c.cutBetweenClaimAndComplete(modeDelay),
		c.upstreamMode(modeReset, time.Second),
		c.upstreamMode(mode5xx, time.Second),
		c.sigtermRestart,
		c.cutBetweenClaimAndComplete(modeDelayReset),
		c.storeBlackholeOne,
		c.restartDuringStoreCut,
		c.upstreamPathCut,
		c.killAnyTime,
		c.upstreamMode(modeHang, time.Second),
		c.storeBlackholeAll,
		c.upstreamMode(modeSlow, time.Second),
	}
	for i := 0; ; i++ {
		sleep(ctx, c.between(c.calm, 2*c.calm))
		if ctx.Err() != nil {
			return
		}
		steps[i%len(steps)](ctx)
	}
}

func (c *chaos) nextKillable() *slot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[c.killable[c.killIdx%len(c.killable)]]
	c.killIdx++
	return s
}

// kill SIGKILLs the slot's replica and starts a new one (same environment,
// new ports) after a short outage; clients learn the new address from the
// slot.
func (c *chaos) kill(s *slot, kind string, downFor time.Duration) {
	inst := s.current()
	inst.kill()
	killedAt, _ := inst.killed()
	f := fault{Kind: kind, Slot: s.idx, Start: killedAt, Detail: fmt.Sprintf("gen %d pid %d", inst.gen, inst.cmd.Process.Pid)}
	time.Sleep(downFor)
	f.Restarted = time.Now()
	if _, err := s.start(); err != nil {
		c.fail(fmt.Errorf("restart after %s: %w", kind, err))
	}
	f.End = time.Now()
	c.record(f)
}

// killInFlight makes the upstream slow enough that many commands are in
// flight through the replica, then SIGKILLs it: those commands ran but
// were never recorded, so their retries run again once the lease ends
// (the documented at-least-once window).
func (c *chaos) killInFlight(ctx context.Context) {
	s := c.nextKillable()
	c.up.setMode(modeDelay)
	time.Sleep(c.up.delay / 2)
	c.kill(s, "sigkill-in-flight", c.between(100*time.Millisecond, 600*time.Millisecond))
	c.up.setMode(modeNormal)
}

// killAnyTime SIGKILLs a replica under the normal load.
func (c *chaos) killAnyTime(ctx context.Context) {
	c.kill(c.nextKillable(), "sigkill", c.between(100*time.Millisecond, time.Second))
}

func (c *chaos) storeCutOne(ctx context.Context) {
	s := c.slots[c.rng.IntN(len(c.slots))]
	d := c.between(time.Second, 3*time.Second)
	f := fault{Kind: "store-cut", Slot: s.idx, Start: time.Now(), Detail: d.String()}
	s.store.Cut()
	sleep(ctx, d)
	s.store.Restore()
	f.End = time.Now()
	c.record(f)
}

func (c *chaos) storeCutAll(ctx context.Context) {
	d := c.between(time.Second, 3*time.Second)
	f := fault{Kind: "store-cut", Slot: -1, Start: time.Now(), Detail: d.String()}
	for _, s := range c.slots {
		s.store.Cut()
	}
	sleep(ctx, d)
	for _, s := range c.slots {
		s.store.Restore()
	}
	f.End = time.Now()
	c.record(f)
}

// storeBlackholeOne loses one replica's store traffic without closing
// anything: operations time out instead of failing fast.
func (c *chaos) storeBlackholeOne(ctx context.Context) {
	s := c.slots[c.rng.IntN(len(c.slots))]
	d := c.between(time.Second, 3*time.Second)
	f := fault{Kind: "store-blackhole", Slot: s.idx, Start: time.Now(), Detail: d.String()}
	s.store.Blackhole()
	sleep(ctx, d)
	s.store.Restore()
	f.End = time.Now()
	c.record(f)
}

// cutBetweenClaimAndComplete delays the upstream's answers (m is
// modeDelay or modeDelayReset), lets commands get claimed and forwarded,
// then cuts the store (of one replica or of all) so that their settling
// fails: idemproxy must keep those locks, never release them — a success
// whose record cannot be written (RECORD WRITE FAILED), or, after a reset,
// an unknown outcome whose key cannot be held (logged so), lives out its
// lease.
func (c *chaos) cutBetweenClaimAndComplete(m upMode) func(context.Context) {
	return func(ctx context.Context) {
		target := -1
		cut := c.slots
		if c.rng.IntN(2) == 0 {
			target = c.rng.IntN(len(c.slots))
			cut = c.slots[target : target+1]
		}
		c.up.setMode(m)
		sleep(ctx, c.up.delay/2)
		d := c.between(1500*time.Millisecond, 2500*time.Millisecond)
		f := fault{Kind: "store-cut-between-claim-and-complete", Slot: target, Start: time.Now(), Detail: d.String() + ", upstream " + m.String()}
		for _, s := range cut {
			s.store.Cut()
		}
		sleep(ctx, d)
		for _, s := range cut {
			s.store.Restore()
		}
		f.End = time.Now()
		c.up.setMode(modeNormal)
		c.record(f)
	}
}

// upstreamMode switches the upstream to m for d.
func (c *chaos) upstreamMode(m upMode, d time.Duration) func(context.Context) {
	return func(ctx context.Context) {
		f := fault{Kind: "upstream-" + m.String(), Slot: -1, Start: time.Now(), Detail: d.String()}
		c.up.setMode(m)
		sleep(ctx, d)
		c.up.setMode(modeNormal)
		f.End = time.Now()
		c.record(f)
	}
}

// upstreamPathCut closes one replica's connections to the upstream, the
// ones in flight included, and refuses new ones for a moment.
func (c *chaos) upstreamPathCut(ctx context.Context) {
	s := c.slots[c.rng.IntN(len(c.slots))]
	d := c.between(300*time.Millisecond, 800*time.Millisecond)
	f := fault{Kind: "upstream-path-cut", Slot: s.idx, Start: time.Now(), Detail: d.String()}
	s.up.Cut()
	sleep(ctx, d)
	s.up.Restore()
	f.End = time.Now()
	c.record(f)
}

// sigtermRestart shuts a replica down gracefully under load: it must
// answer every request it accepted, and settle every command it
// forwarded, before it exits; clients get refused connections afterwards.
// Just before the signal the upstream turns slow or hanging for the
// commands that reach it, so the replica drains calls that go on
// detached: the slow ones answer within the shutdown budget and are
// recorded, the hanging ones are cancelled at the budget's end and their
// keys held. Neither may run again.
func (c *chaos) sigtermRestart(ctx context.Context) {
	s := c.nextKillable()
	inst := s.current()
	c.up.setMode(modeSlowOrHang)
	sleep(ctx, upstreamTimeout/2)
	c.up.setMode(modeNormal)
	f := fault{Kind: "sigterm", Slot: s.idx, Start: time.Now(),
		Detail: fmt.Sprintf("gen %d pid %d, upstream slow or hanging for the %s before it", inst.gen, inst.cmd.Process.Pid, upstreamTimeout/2)}
	inst.mu.Lock()
	inst.drainedUnderLoad = true
	inst.mu.Unlock()
	if err := inst.stop(30 * time.Second); err != nil {
		c.fail(fmt.Errorf("sigterm: %w", err))
	}
	time.Sleep(c.between(100*time.Millisecond, 500*time.Millisecond))
	if _, err := s.start(); err != nil {
		c.fail(fmt.Errorf("restart after sigterm: %w", err))
	}
	f.End = time.Now()
	c.record(f)
}

// restartDuringStoreCut SIGKILLs a replica whose store path is cut and
// starts a new one while it is still cut: it must come up (its start-up
// step, Postgres's migrations or Redis's check, retried in the background,
// not ready meanwhile) and become ready once the store is back.
func (c *chaos) restartDuringStoreCut(ctx context.Context) {
	s := c.nextKillable()
	d := c.between(1500*time.Millisecond, 3*time.Second)
	cut := fault{Kind: "store-cut", Slot: s.idx, Start: time.Now(), Detail: d.String() + ", replica restarted meanwhile"}
	s.store.Cut()
	inst := s.current()
	inst.kill()
	killedAt, _ := inst.killed()
	f := fault{Kind: "sigkill-restart-while-store-cut", Slot: s.idx, Start: killedAt,
		Detail: fmt.Sprintf("gen %d pid %d", inst.gen, inst.cmd.Process.Pid), Restarted: time.Now()}
	started := make(chan error, 1)
	go func() {
		_, err := s.start()
		started <- err
	}()
	time.Sleep(d)
	s.store.Restore()
	cut.End = time.Now()
	c.record(cut)
	if err := <-started; err != nil {
		c.fail(fmt.Errorf("restart while the store was cut: %w", err))
	}
	f.End = time.Now()
	c.record(f)
}

func (c *chaos) storeBlackholeAll(ctx context.Context) {
	d := c.between(time.Second, 2500*time.Millisecond)
	f := fault{Kind: "store-blackhole", Slot: -1, Start: time.Now(), Detail: d.String()}
	for _, s := range c.slots {
		s.store.Blackhole()
	}
	sleep(ctx, d)
	for _, s := range c.slots {
		s.store.Restore()
	}
	f.End = time.Now()
	c.record(f)
}
