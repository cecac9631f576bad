//go:build fault

package faultsuite

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/internal/problem"
)

// Reasons a command may legitimately run a second time (the documented
// at-least-once windows): its first execution's outcome never reached the
// store before the lease ended.
const (
	// reasonKilled: the replica that forwarded it was SIGKILLed while it
	// was in flight.
	reasonKilled = "replica-killed-in-flight"
	// reasonUnknownOutcome: the proxy got no answer (a reset or cut
	// connection, the command timeout) and could not hold the key (the
	// store was away): it logged so for the command, and the lock lived
	// out its lease. A held key is never run again, so an unknown
	// outcome alone explains nothing.
	reasonUnknownOutcome = "outcome-unknown-key-not-held"
	// reasonUnknownReleased: under IDEMPROXY_UNKNOWN_OUTCOME=release, the
	// proxy got no answer (upstream timeout, reset, cut connection) and
	// said so: 502/504, lock kept for the lease.
	reasonUnknownReleased = "upstream-outcome-unknown-released"
	// reasonRecordWriteFailed: the upstream answered 2xx but the record
	// could not be written (RECORD WRITE FAILED), lock kept for the lease.
	reasonRecordWriteFailed = "record-write-failed"
	// reasonLockLost: the record write was still being retried when the
	// lease ended and another replica claimed the key.
	reasonLockLost = "record-write-late-lock-lost"
)

// evidence is what the suite learned about the run besides the upstream's
// counts: faults, and what the replicas logged.
type evidence struct {
	lease time.Duration
	// release: the replicas ran with IDEMPROXY_UNKNOWN_OUTCOME=release.
	release       bool
	faults        []fault
	recordFailed  map[string]bool // command ids
	lockLost      map[string]bool
	upstreamError map[string]bool // command ids the proxy answered 502/504 for, as its clients saw
	held          map[string]bool // command ids whose key was held as outcome unknown
	notHeld       map[string]bool // command ids whose key could not be held
}

// explain returns why execution e may have been followed by another, or
// "" if nothing explains it.
func (ev *evidence) explain(e execution) string {
	switch {
	case ev.recordFailed[e.CommandID]:
		return reasonRecordWriteFailed
	case ev.lockLost[e.CommandID]:
		return reasonLockLost
	}
	// The proxy settles a command when the upstream's answer (or its
	// failure) reaches it, which the upstream saw as the end of its
	// handler; a live call ends within the upstream timeout, a detached
	// one within the command timeout.
	settling := e.Done
	if settling.IsZero() {
		settling = e.Received
	}
	for _, f := range ev.faults {
		if !strings.HasPrefix(f.Kind, "sigkill") || f.Slot != e.Slot {
			continue
		}
		// Sent by the killed process (received before its successor
		// was launched: what it wrote just before the signal may reach
		// the upstream just after), and ended at most a lease before
		// the kill: it may never have been settled.
		if e.Received.Before(f.Restarted) && f.Start.Sub(settling) <= ev.lease+time.Second {
			return reasonKilled
		}
	}
	if !ev.release {
		if ev.notHeld[e.CommandID] {
			return reasonUnknownOutcome
		}
		return ""
	}
	if e.Mode == modeSlow || e.Mode == modeHang || e.Mode == modeReset || e.Mode == modeDelayReset || ev.upstreamError[e.CommandID] {
		return reasonUnknownReleased
	}
	for _, f := range ev.faults {
		if f.Kind != "upstream-path-cut" || f.Slot != e.Slot {
			continue
		}
		// The connection was cut while the answer was on its way.
		if !f.Start.Before(e.Received) && !f.Start.After(settling.Add(200*time.Millisecond)) {
			return reasonUnknownReleased
		}
	}
	return ""
}

// dupReport describes one (tenant, key) the upstream ran more than once.
type dupReport struct {
	Tenant     string   `json:"tenant"`
	Key        string   `json:"key"`
	Executions []string `json:"executions"`
	Reasons    []string `json:"reasons"`
	Problem    string   `json:"problem,omitempty"`
}

// verdict is the key-by-key result.
type verdict struct {
	Executions            int            `json:"executions"`
	KeysExecuted          int            `json:"keys_executed"`
	KeysExecutedTwicePlus int            `json:"keys_executed_more_than_once"`
	ExplainedDuplicates   int            `json:"explained_duplicates"`
	ExplainedByReason     map[string]int `json:"explained_by_reason"`
	UnexplainedDuplicates int            `json:"unexplained_duplicates"`
	EarlyDuplicates       int            `json:"duplicates_within_lease"`
	SameCommandTwice      int            `json:"same_command_id_executed_twice"`
	Unexplained           []dupReport    `json:"unexplained,omitempty"`
	ExplainedSamples      []dupReport    `json:"explained_samples,omitempty"`

	Keys                int      `json:"keys"`
	KeysOK              int      `json:"keys_ok"`
	KeysFirstTime2xx    int      `json:"keys_first_time_2xx"`
	KeysReplayed2xx     int      `json:"keys_replayed_2xx"`
	KeysFailed          int      `json:"keys_without_2xx"`
	KeysFailedDefinite  int      `json:"keys_without_2xx_definite_error"`
	FailedSamples       []string `json:"keys_without_2xx_samples,omitempty"`
	OKWithoutExecution  int      `json:"2xx_for_command_never_executed"`
	ReplayChecks        int      `json:"replay_checks"`
	ReplayChecksOK      int      `json:"replay_checks_ok"`
	ReplayMismatchExpl  int      `json:"replay_checks_rerun_explained"`
	ReplayMismatchUnexp int      `json:"replay_checks_mismatch_unexplained"`
	ReplayCheckFailed   int      `json:"replay_checks_without_2xx"`
	Variants            int      `json:"variant_bodies_sent"`
	Variants422         int      `json:"variant_bodies_422"`
	// VariantsRanExplained counts reused keys whose first command's
	// record never landed (an explained duplicate) and whose lease had
	// ended, so the different body ran as a new command.
	VariantsRanExplained int      `json:"variant_bodies_ran_after_lease_explained"`
	VariantsOther        []string `json:"variant_bodies_other,omitempty"`

	// KeysHeld counts the keys a client saw held as outcome unknown (409
	// outcome-unknown, or the 502/504 of the attempt whose key was held),
	// KeysHeldConfirmed those the admin API showed held for that command
	// at the end; by how often the upstream executed them:
	// HeldNotExecuted (the request never reached it), HeldExecutedOnce,
	// HeldExecutedMore (each duplicate explained, as any other).
	KeysHeld          int `json:"keys_held"`
	KeysHeldConfirmed int `json:"keys_held_confirmed_by_admin_api"`
	HeldNotExecuted   int `json:"keys_held_not_executed"`
	HeldExecutedOnce  int `json:"keys_held_executed_once"`
	HeldExecutedMore  int `json:"keys_held_executed_more_explained"`
	// HeldExecutedMoreSamples name the first of those keys.
	HeldExecutedMoreSamples []string `json:"keys_held_executed_more_samples,omitempty"`
	// HeldAfter2xx counts held keys whose client had a 2xx before: the
	// command's record never landed, it ran again and that run was held.
	HeldAfter2xx int `json:"keys_held_after_2xx_record_lost"`
	// HeldInStore counts the entries the store holds as outcome unknown
	// for the run's tenants.
	HeldInStore int `json:"entries_held_in_store"`

	Violations []string `json:"violations,omitempty"`
	// LockLostFalseAlarms counts "lock expired and was claimed again"
	// reports for commands that ran once and whose record is written
	// (see TestCompleteWhoseAckWasLostIsNotALostLock).
	LockLostFalseAlarms int `json:"lock_lost_false_alarms"`
}

// storedEntry is what the store holds for a key at the end (on Postgres,
// its row in idempotency_keys).
type storedEntry struct {
	state, commandID string
}

// heldView is what the admin API showed, at the end of the load, for a key
// a client saw held.
type heldView struct {
	state, commandID string
	err              string // the lookup failed
}

// judge checks every key: executions against evidence, what the clients
// got, the held keys as the admin API shows them, and the entries left in
// the store. unheldNoAnswer are the commands answered 502
// upstream-no-response with X-Should-Retry: true.
func judge(execs map[string][]execution, byCmd map[string]int, results []*keyResult, rows map[string]storedEntry,
	held map[string]heldView, unheldNoAnswer []string, ev *evidence) verdict {
	v := verdict{ExplainedByReason: map[string]int{}}
	violate := func(format string, args ...any) {
		if len(v.Violations) < 100 {
			v.Violations = append(v.Violations, fmt.Sprintf(format, args...))
		}
	}
	for id, n := range byCmd {
		if n > 1 {
			v.SameCommandTwice++
			violate("command %s executed %d times (one forward delivered twice)", id, n)
		}
	}

	ids := make([]string, 0, len(execs))
	for id := range execs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	allExplained := map[string]bool{} // keys whose duplicates are all explained
	executedCmds := map[string]map[string]bool{}
	for _, id := range ids {
		es := execs[id]
		sort.Slice(es, func(i, j int) bool { return es[i].Received.Before(es[j].Received) })
		v.Executions += len(es)
		v.KeysExecuted++
		cmds := map[string]bool{}
		for _, e := range es {
			cmds[e.CommandID] = true
		}
		executedCmds[id] = cmds
		if len(es) < 2 {
			continue
		}
		v.KeysExecutedTwicePlus++
		tenant, key := splitKeyID(id)
		d := dupReport{Tenant: tenant, Key: key}
		for _, e := range es {
			d.Executions = append(d.Executions, fmt.Sprintf("%s via replica %d (%s) at %s, answered after %s",
				e.CommandID, e.Slot, e.Mode, e.Received.Format("15:04:05.000"), e.Done.Sub(e.Received).Round(time.Millisecond)))
		}
		ok := true
		for i := 0; i+1 < len(es); i++ {
			why := ev.explain(es[i])
			gap := es[i+1].Received.Sub(es[i].Received)
			if gap < ev.lease-time.Second {
				v.EarlyDuplicates++
				d.Problem = fmt.Sprintf("ran again %s after the previous execution, inside its %s lease", gap.Round(time.Millisecond), ev.lease)
				why = ""
			}
			if why == "" {
				why = "UNEXPLAINED"
				ok = false
				v.UnexplainedDuplicates++
			} else {
				v.ExplainedDuplicates++
				v.ExplainedByReason[why]++
			}
			d.Reasons = append(d.Reasons, why)
		}
		if ok {
			allExplained[id] = true
			if len(v.ExplainedSamples) < 10 {
				v.ExplainedSamples = append(v.ExplainedSamples, d)
			}
		} else if len(v.Unexplained) < 50 {
			v.Unexplained = append(v.Unexplained, d)
		}
	}

	for id, es := range execs {
		if len(es) == 1 && ev.lockLost[es[0].CommandID] && rows[id].state == "succeeded" && rows[id].commandID == es[0].CommandID {
			v.LockLostFalseAlarms++
		}
	}

	// A record that never landed: its command may run again.
	lost := func(cmd string) bool { return ev.recordFailed[cmd] || ev.lockLost[cmd] }
	seenHeld := map[string]bool{}
	for _, kr := range results {
		v.Keys++
		id := keyID(kr.Tenant, kr.Key)
		if kr.Held {
			seenHeld[id] = true
			v.judgeHeld(id, kr, execs[id], held[id], allExplained[id], violate)
			if kr.OK {
				if lost(kr.CommandID) {
					v.HeldAfter2xx++
				} else {
					violate("%s: got 2xx for command %s, whose record was written, then was held (command %s)", id, kr.CommandID, kr.HeldCommandID)
				}
			}
		}
		if !kr.OK {
			if kr.Held {
				continue
			}
			v.KeysFailed++
			if kr.Definite {
				v.KeysFailedDefinite++
			}
			if len(v.FailedSamples) < 20 {
				v.FailedSamples = append(v.FailedSamples, fmt.Sprintf("%s after %d attempts: %s", id, kr.Attempts, kr.Last))
			}
			continue
		}
		v.KeysOK++
		if kr.Replayed {
			v.KeysReplayed2xx++
		} else {
			v.KeysFirstTime2xx++
		}
		if kr.CommandID == "" || !executedCmds[id][kr.CommandID] {
			v.OKWithoutExecution++
			violate("%s: 2xx (replayed %v) names command %q, which the upstream never ran for this key", id, kr.Replayed, kr.CommandID)
		}
		if kr.ReplayCheck != "" {
			v.ReplayChecks++
			switch {
			case kr.ReplayCheck == "ok":
				v.ReplayChecksOK++
			case kr.ReplayCheck == "mismatch" && len(execs[id]) > 1 && allExplained[id],
				kr.Held && lost(kr.CommandID):
				// The record never landed: the command ran again (and
				// may have been held).
				v.ReplayMismatchExpl++
			case kr.ReplayCheck == "mismatch":
				v.ReplayMismatchUnexp++
				violate("%s: sent again after its 2xx (command %s), got a 2xx for command %s that is not its replay",
					id, kr.CommandID, kr.ReplayCommandID)
			default:
				v.ReplayCheckFailed++
			}
		}
		if kr.Variant != "" {
			v.Variants++
			switch {
			case strings.HasPrefix(kr.Variant, "422"):
				v.Variants422++
			case strings.HasPrefix(kr.Variant, "2") && len(execs[id]) > 1 && allExplained[id],
				kr.Held && lost(kr.CommandID):
				// The first command's record never landed and its
				// lease ended: the key was free again (and the variant
				// may have been held).
				v.VariantsRanExplained++
			default:
				v.VariantsOther = append(v.VariantsOther, id+": "+kr.Variant)
			}
		}
		// The record must be durable and name the command the client was
		// last told about, unless that command's record write failed.
		last := kr.CommandID
		if kr.ReplayCommandID != "" {
			last = kr.ReplayCommandID
		}
		if lost(last) {
			continue
		}
		row, found := rows[id]
		switch {
		case !found:
			violate("%s: got 2xx for command %s but the store holds no entry for it", id, last)
		case row.state != "succeeded":
			violate("%s: got 2xx for command %s but its entry is %s (command %s): the response was released before the record was durable",
				id, last, row.state, row.commandID)
		case row.commandID != last && !(kr.Variant != "" && executedCmds[id][row.commandID] && allExplained[id]):
			violate("%s: the client was told command %s, the record names %s", id, last, row.commandID)
		}
	}

	// Every entry held in the store is a key a client saw held, and every
	// command answered 502 with a hint to retry could not be held.
	heldLogged := len(ev.held)
	for id, row := range rows {
		if row.state != "unknown" {
			continue
		}
		v.HeldInStore++
		if !seenHeld[id] {
			violate("%s: held in the store (command %s), but no client saw it held", id, row.commandID)
		}
	}
	if heldLogged > v.HeldInStore {
		violate("the replicas logged %d keys held, the store holds %d", heldLogged, v.HeldInStore)
	}
	if !ev.release {
		for _, cmd := range unheldNoAnswer {
			if !ev.notHeld[cmd] {
				violate("command %s was answered 502 upstream-no-response with %s: true under hold, but its replica did not log that the key could not be held",
					cmd, problem.HeaderShouldRetry)
			}
		}
	}
	return v
}

// judgeHeld checks a key its client saw held: the admin API shows it held
// for the command the client was told of, and the upstream executed it at
// most once, or more often with every duplicate explained, and never after
// the held command.
func (v *verdict) judgeHeld(id string, kr *keyResult, es []execution, view heldView, explained bool, violate func(string, ...any)) {
	v.KeysHeld++
	cmd := kr.HeldCommandID
	switch {
	case view.err != "":
		violate("%s: a client saw it held (command %s); the admin API lookup failed: %s", id, cmd, view.err)
	case view.state != "unknown":
		violate("%s: a client saw it held (command %s); the admin API shows it %q (command %s)", id, cmd, view.state, view.commandID)
	case cmd != "" && view.commandID != cmd:
		violate("%s: a client saw it held for command %s; the admin API shows it held for command %s", id, cmd, view.commandID)
	default:
		v.KeysHeldConfirmed++
	}
	if cmd == "" {
		cmd = view.commandID
	}
	switch {
	case len(es) == 0:
		v.HeldNotExecuted++
	case len(es) == 1:
		v.HeldExecutedOnce++
	case explained:
		v.HeldExecutedMore++
		if len(v.HeldExecutedMoreSamples) < 10 {
			v.HeldExecutedMoreSamples = append(v.HeldExecutedMoreSamples, fmt.Sprintf("%s: held for command %s, executed %d times", id, cmd, len(es)))
		}
	default:
		violate("%s: held (command %s) and executed %d times, not every duplicate explained", id, cmd, len(es))
	}
	for i, e := range es {
		if e.CommandID != cmd {
			continue
		}
		for _, later := range es[i+1:] {
			if later.CommandID == cmd {
				continue // the same command twice: SameCommandTwice
			}
			violate("%s: held for command %s, then executed again as command %s", id, cmd, later.CommandID)
		}
	}
}
