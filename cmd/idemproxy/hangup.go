package main

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reloader is one thing SIGHUP reloads in place: the routes file, and
// whatever else the serving process can re-read (listener certificates).
type reloader struct {
	// what names it in the log ("routes file").
	what string
	// reload re-reads it and returns attributes that describe what is in
	// force now; on an error what was in force stays.
	reload func() ([]any, error)
}

// hangups catches SIGHUP so that the signal never ends the process (its
// default action), from the first line of main, before configuration is
// read or any connection made. On each SIGHUP it runs the reloaders added
// so far and logs what each did, or that there was nothing to reload. A
// SIGHUP that arrives while the process starts is carried out once start-up
// ends (Started), so an edit made meanwhile is not lost.
type hangups struct {
	sig       chan os.Signal
	done      chan struct{}
	reloading sync.Mutex // one reload at a time

	mu        sync.Mutex
	log       *slog.Logger
	reloaders []reloader
	starting  bool
	pending   bool // a SIGHUP came while starting
	none      string
}

// catchHangups starts catching SIGHUP, logging to log until SetLogger.
func catchHangups(log *slog.Logger) *hangups {
	h := &hangups{sig: make(chan os.Signal, 1), done: make(chan struct{}), log: log, starting: true}
	signal.Notify(h.sig, syscall.SIGHUP)
	go h.loop()
	return h
}

// Stop stops catching SIGHUP: from then on the signal's default action
// applies again.
func (h *hangups) Stop() {
	signal.Stop(h.sig)
	close(h.done)
}

// SetLogger logs to log from now on.
func (h *hangups) SetLogger(log *slog.Logger) {
	h.mu.Lock()
	h.log = log
	h.mu.Unlock()
}

// Add makes SIGHUP reload r too.
func (h *hangups) Add(r reloader) {
	h.mu.Lock()
	h.reloaders = append(h.reloaders, r)
	h.mu.Unlock()
}

// Started ends start-up: none says why there is nothing to reload when
// no reloader was added. A SIGHUP caught during start-up is carried out
// now.
func (h *hangups) Started(none string) {
	h.mu.Lock()
	h.starting, h.none = false, none
	pending := h.pending
	h.pending = false
	h.mu.Unlock()
	if pending {
		h.reload("a SIGHUP arrived during start-up")
	}
}

func (h *hangups) loop() {
	for {
		select {
		case <-h.done:
			return
		case <-h.sig:
			h.reload("")
		}
	}
}

// reload runs every reloader in turn and logs the outcome of each.
func (h *hangups) reload(why string) {
	h.mu.Lock()
	log, reloaders, none := h.log, h.reloaders, h.none
	if h.starting {
		h.pending = true
		h.mu.Unlock()
		log.Info("SIGHUP: nothing to reload yet: still starting; the reloadable settings are reloaded once start-up ends")
		return
	}
	h.mu.Unlock()
	h.reloading.Lock()
	defer h.reloading.Unlock()
	if why != "" {
		log = log.With("reason", why)
	}
	if len(reloaders) == 0 {
		log.Info("SIGHUP: nothing to reload: " + none)
		return
	}
	for _, r := range reloaders {
		attrs, err := r.reload()
		if err != nil {
			log.Error("SIGHUP: "+r.what+" not reloaded: what was in force stays", append(attrs, "error", err.Error())...)
			continue
		}
		log.Info("SIGHUP: "+r.what+" reloaded", attrs...)
	}
}
