package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
)

// keysCmd runs "idemproxy keys args..." with env.
func keysCmd(env map[string]string, args ...string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), append([]string{"idemproxy", "keys"}, args...), mapEnv(env), &out, io.Discard)
	return out.String(), err
}

// TestKeysAdminAddress: -admin (and IDEMPROXY_ADMIN_ADDR) take host:port
// as IDEMPROXY_ADMIN_ADDR does, or a URL.
func TestKeysAdminAddress(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	tenant := uuid.NewString()
	post(t, s.proxy+"/orders", "addr-1", tenant, "x")
	hostPort := strings.TrimPrefix(s.admin, "http://")
	_, port, _ := net.SplitHostPort(hostPort)
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken}
	for _, admin := range []string{hostPort, ":" + port, "0.0.0.0:" + port, s.admin, s.admin + "/"} {
		out, err := keysCmd(env, "get", "-json", "-admin", admin, "-tenant", tenant, "-key", "addr-1")
		if err != nil || !strings.Contains(out, `"state":"succeeded"`) {
			t.Errorf("keys get -admin %s: %q %v", admin, out, err)
		}
	}
	fromEnv := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken, "IDEMPROXY_ADMIN_ADDR": hostPort}
	if out, err := keysCmd(fromEnv, "get", "-json", "-tenant", tenant, "-key", "addr-1"); err != nil || !strings.Contains(out, `"state":"succeeded"`) {
		t.Errorf("keys get with IDEMPROXY_ADMIN_ADDR=%s: %q %v", hostPort, out, err)
	}
	for _, bad := range []string{"9090", "ftp://127.0.0.1:9090", "http://"} {
		_, err := keysCmd(env, "get", "-admin", bad, "-tenant", tenant, "-key", "addr-1")
		if err == nil || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("keys get -admin %s: got %v, want an error asking for host:port or a URL", bad, err)
		}
	}
}

// TestHelp: --help lists every command; keys -h and keys get -h print
// the usage and succeed.
func TestHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"idemproxy", "--help"}, mapEnv(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"idemproxy demo ", "idemproxy demo-upstream", "idemproxy migrate", "idemproxy keys get|delete",
		"idemproxy keys list", "idemproxy healthcheck", "idemproxy version"} {
		if !strings.Contains(out.String(), cmd) {
			t.Errorf("--help does not list %q:\n%s", cmd, out.String())
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}, {"get", "-h"}, {"delete", "--help"}, {"list", "-h"}} {
		out, err := keysCmd(nil, args...)
		if err != nil || !strings.Contains(out, "usage: idemproxy keys") {
			t.Errorf("keys %v: %q, %v; want the usage and success", args, out, err)
		}
	}
	if _, err := keysCmd(nil, "get", "-frobnicate"); err == nil {
		t.Error("keys get with an unknown flag succeeded")
	}
}

// TestKeysList: keys list prints a tenant's keys newest first, a page at
// a time, and the command for the next page.
func TestKeysList(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	tenant := uuid.NewString()
	for _, key := range []string{"list-1", "list-2", "list-3"} {
		post(t, s.proxy+"/orders", key, tenant, key)
	}
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken, "IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	out, err := keysCmd(env, "list", "-tenant", tenant, "-limit", "2")
	if err != nil {
		t.Fatalf("keys list: %v", err)
	}
	rows := regexp.MustCompile(`(?m)^(list-\d)\s+succeeded\s+201\s`).FindAllStringSubmatch(out, -1)
	next := regexp.MustCompile(`(?m)^more: idemproxy keys list -tenant ` + tenant + ` -limit 2 -cursor (\S+)$`).FindStringSubmatch(out)
	if len(rows) != 2 || rows[0][1] != "list-3" || rows[1][1] != "list-2" || next == nil {
		t.Fatalf("first page:\n%s", out)
	}
	out, err = keysCmd(env, "list", "-tenant", tenant, "-limit", "2", "-cursor", next[1], "-json")
	if err != nil {
		t.Fatalf("keys list -cursor: %v", err)
	}
	var page struct {
		Keys []struct{ Key string }
		Next string `json:"next_cursor"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Keys) != 1 || page.Keys[0].Key != "list-1" || page.Next != "" {
		t.Fatalf("second page (-json): %s (%v)", out, err)
	}
	if _, err := keysCmd(env, "list"); err == nil || !strings.Contains(err.Error(), "-tenant") {
		t.Errorf("keys list without -tenant: %v", err)
	}
}

// TestKeysListNextPage: the next-page command that keys list prints, run
// as printed, continues the listing: it repeats -admin and -limit. With
// -json the page goes to stdout untouched and the command to stderr.
func TestKeysListNextPage(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	tenant := uuid.NewString()
	for _, key := range []string{"page-1", "page-2", "page-3"} {
		post(t, s.proxy+"/orders", key, tenant, key)
	}
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken} // no IDEMPROXY_ADMIN_ADDR: only -admin finds it
	nextArgs := func(out string) []string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^more: idemproxy keys (.*)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no next-page command in:\n%s", out)
		}
		return strings.Fields(m[1])
	}
	out, err := keysCmd(env, "list", "-admin", s.admin, "-tenant", tenant, "-limit", "1")
	if err != nil || !strings.Contains(out, "page-3") {
		t.Fatalf("first page: %v\n%s", err, out)
	}
	next := nextArgs(out)
	out, err = keysCmd(env, next...)
	if err != nil || !strings.Contains(out, "page-2") || strings.Contains(out, "page-1") {
		t.Fatalf("keys %s: %v\n%s", strings.Join(next, " "), err, out)
	}

	var stdout, stderr bytes.Buffer
	args := []string{"idemproxy", "keys", "list", "-json", "-admin", s.admin, "-tenant", tenant, "-limit", "2"}
	if err := run(context.Background(), args, mapEnv(env), &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var page struct {
		Keys []struct{ Key string }
	}
	if err := json.Unmarshal(stdout.Bytes(), &page); err != nil || len(page.Keys) != 2 {
		t.Fatalf("-json page: %v\n%s", err, stdout.String())
	}
	next = nextArgs(stderr.String())
	if !slices.Contains(next, "-json") {
		t.Errorf("the next-page command drops -json: %s", stderr.String())
	}
	out, err = keysCmd(env, next...)
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Keys) != 1 || page.Keys[0].Key != "page-1" {
		t.Fatalf("keys %s: %v\n%s", strings.Join(next, " "), err, out)
	}
}

// TestKeysGetTable: keys get prints a table, as keys list does; -json
// prints the admin API's JSON.
func TestKeysGetTable(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	tenant := uuid.NewString()
	post(t, s.proxy+"/orders", "get-1", tenant, "x")
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken, "IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	out, err := keysCmd(env, "get", "-tenant", tenant, "-key", "get-1")
	if err != nil || !regexp.MustCompile(`(?m)^KEY\s+STATE\s+STATUS\s+CREATED\s+EXPIRES\s+COMMAND\nget-1\s+succeeded\s+201\s`).MatchString(out) {
		t.Errorf("keys get: %v\n%s", err, out)
	}
	out, err = keysCmd(env, "get", "-json", "-tenant", tenant, "-key", "get-1")
	var view struct{ Key, State string }
	if err != nil || json.Unmarshal([]byte(out), &view) != nil || view.Key != "get-1" || view.State != "succeeded" {
		t.Errorf("keys get -json: %v\n%s", err, out)
	}
}

// testAdminToken is an admin token long enough to be accepted.
const testAdminToken = "admin-token-0123456789"

// TestKeysHeld: a command whose upstream broke off is held; keys list
// -state unknown lists it, keys resolve records it as succeeded, and the
// client's retry then replays it without reaching the upstream.
func TestKeysHeld(t *testing.T) {
	var reset atomic.Bool
	reset.Store(true)
	up, calls := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if reset.Load() {
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	tenant := uuid.NewString()
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken, "IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	if resp := post(t, s.proxy+"/orders", "held-1", tenant, "x"); resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("reset: %d, X-Should-Retry %q; want 502 and false", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
	}
	reset.Store(false)
	post(t, s.proxy+"/orders", "recorded", tenant, "x")
	if resp := post(t, s.proxy+"/orders", "held-1", tenant, "x"); resp.StatusCode != http.StatusConflict {
		t.Fatalf("retry of a held key: %d, want 409", resp.StatusCode)
	}

	out, err := keysCmd(env, "list", "-tenant", tenant, "-state", "unknown")
	if err != nil || !strings.Contains(out, "held-1") || strings.Contains(out, "recorded") || !strings.Contains(out, "unknown") {
		t.Fatalf("keys list -state unknown: %q %v; want held-1 alone", out, err)
	}
	if _, err := keysCmd(env, "list", "-tenant", tenant, "-state", "stuck"); err == nil || !strings.Contains(err.Error(), "state") {
		t.Errorf("keys list -state stuck: %v, want the admin API's refusal naming state", err)
	}
	for _, bad := range [][]string{{}, {"-status", "42"}} {
		args := append([]string{"resolve", "-tenant", tenant, "-key", "held-1"}, bad...)
		if _, err := keysCmd(env, args...); err == nil || !strings.Contains(err.Error(), "-status") {
			t.Errorf("keys %v: %v, want -status refused", args, err)
		}
	}
	out, err = keysCmd(env, "get", "-json", "-tenant", tenant, "-key", "held-1")
	var view struct {
		CommandID string `json:"command_id"`
	}
	if err != nil || json.Unmarshal([]byte(out), &view) != nil {
		t.Fatalf("keys get: %q %v", out, err)
	}
	if _, err := keysCmd(env, "resolve", "-tenant", tenant, "-key", "held-1", "-status", "201", "-command", uuid.NewString()); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("keys resolve naming another command: %v, want 409", err)
	}
	out, err = keysCmd(env, "resolve", "-tenant", tenant, "-key", "held-1", "-status", "201", "-command", view.CommandID)
	if err != nil || !strings.Contains(out, "succeeded") || !strings.Contains(out, "201") {
		t.Fatalf("keys resolve: %q %v", out, err)
	}
	resp := post(t, s.proxy+"/orders", "held-1", tenant, "x")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the resolution: %d, replayed %q; want the 201 replayed", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("upstream calls: %d, want 2 (the held command once, the other key once)", n)
	}
}
