package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"regexp"
	"strings"
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
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": "admin-token"})
	tenant := uuid.NewString()
	post(t, s.proxy+"/orders", "addr-1", tenant, "x")
	hostPort := strings.TrimPrefix(s.admin, "http://")
	_, port, _ := net.SplitHostPort(hostPort)
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": "admin-token"}
	for _, admin := range []string{hostPort, ":" + port, "0.0.0.0:" + port, s.admin, s.admin + "/"} {
		out, err := keysCmd(env, "get", "-admin", admin, "-tenant", tenant, "-key", "addr-1")
		if err != nil || !strings.Contains(out, `"state":"succeeded"`) {
			t.Errorf("keys get -admin %s: %q %v", admin, out, err)
		}
	}
	fromEnv := map[string]string{"IDEMPROXY_ADMIN_TOKEN": "admin-token", "IDEMPROXY_ADMIN_ADDR": hostPort}
	if out, err := keysCmd(fromEnv, "get", "-tenant", tenant, "-key", "addr-1"); err != nil || !strings.Contains(out, `"state":"succeeded"`) {
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
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": "admin-token"})
	tenant := uuid.NewString()
	for _, key := range []string{"list-1", "list-2", "list-3"} {
		post(t, s.proxy+"/orders", key, tenant, key)
	}
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": "admin-token", "IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	out, err := keysCmd(env, "list", "-tenant", tenant, "-limit", "2")
	if err != nil {
		t.Fatalf("keys list: %v", err)
	}
	rows := regexp.MustCompile(`(?m)^(list-\d)\s+succeeded\s+201\s`).FindAllStringSubmatch(out, -1)
	next := regexp.MustCompile(`(?m)^more: idemproxy keys list -tenant ` + tenant + ` -cursor (\S+)$`).FindStringSubmatch(out)
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
