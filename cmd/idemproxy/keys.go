package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

const keysSynopsis = `usage: idemproxy keys get|delete -tenant TENANT -key KEY [-json] [-admin ADDR]
       idemproxy keys list -tenant TENANT [-state unknown] [-limit N] [-cursor C] [-json] [-admin ADDR]
       idemproxy keys resolve -tenant TENANT -key KEY -status N [-command ID] [-json] [-admin ADDR]`

const keysUsage = keysSynopsis + `

Talks to a running idemproxy's admin API (/v1/keys) with the bearer token
in IDEMPROXY_ADMIN_TOKEN.
  get      show the lock, record or held key of a key
  delete   remove it, to unstick a key after an incident: a held key
           (outcome unknown) is freed, and the next retry runs the
           command (audit-logged)
  list     a tenant's live locks, records and held keys, newest first, a
           page at a time, then the command for the next page (on stderr
           with -json); -state unknown lists the held keys alone
  resolve  record a held key as succeeded with -status: the command took
           effect, and retries replay it from then on (audit-logged);
           -command names the held command, so that a key held again
           for another command since is left alone

TENANT is the tenant's UUID or, when the proxy runs with
IDEMPROXY_TENANT_FORMAT=any, the tenant string its clients send (acme):
the proxy finds it under that string's UUID.

get, list and resolve print a table; -json prints the admin API's JSON
instead.

Flags:
`

// runKeys is "idemproxy keys get|delete|list": it talks to a running
// idemproxy's admin API. -h prints the usage and succeeds. Results go to
// stdout; with -json, the next-page command of list goes to stderr.
func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(keysSynopsis)
	}
	op := args[0]
	if isHelp(op) {
		fmt.Fprint(stdout, strings.TrimSuffix(keysUsage, "Flags:\n"))
		return nil
	}
	if op != "get" && op != "delete" && op != "list" && op != "resolve" {
		return fmt.Errorf("unknown keys command %q\n%s", op, keysSynopsis)
	}
	fs := flag.NewFlagSet("keys "+op, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	tenant := fs.String("tenant", "", "tenant: its UUID, or its string under IDEMPROXY_TENANT_FORMAT=any")
	key := fs.String("key", "", "idempotency key (get, delete, resolve)")
	state := fs.String("state", "", "list only the keys in this state: unknown, the held keys (list)")
	status := fs.Int("status", 0, "the status code the held key's record replays (resolve)")
	command := fs.String("command", "", "the held command's id, as get shows it (resolve; optional)")
	limit := fs.Int("limit", 0, "most keys per page (list; default 50, at most 1000)")
	cursor := fs.String("cursor", "", "continue a listing where the previous page ended (list)")
	asJSON := fs.Bool("json", false, "print the admin API's JSON instead of a table (get, list, resolve)")
	admin := fs.String("admin", getenv("IDEMPROXY_ADMIN_ADDR"),
		"admin listener: host:port as in IDEMPROXY_ADMIN_ADDR (default), or a URL")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, keysUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("keys %s: %v (idemproxy keys -h for the usage)", op, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("keys %s: unexpected argument %q (idemproxy keys -h for the usage)", op, fs.Arg(0))
	}
	if *tenant == "" || (op != "list" && *key == "") {
		required := "-tenant and -key are"
		if op == "list" {
			required = "-tenant is"
		}
		return fmt.Errorf("keys %s: %s required (idemproxy keys -h for the usage)", op, required)
	}
	if op == "resolve" && (*status < 100 || *status > 599) {
		return fmt.Errorf("keys resolve: -status must be an HTTP status code from 100 to 599, such as 201 (idemproxy keys -h for the usage)")
	}
	base, err := adminURL(*admin)
	if err != nil {
		return fmt.Errorf("keys %s: -admin: %w", op, err)
	}
	token := getenv("IDEMPROXY_ADMIN_TOKEN")
	if token == "" {
		return errors.New("IDEMPROXY_ADMIN_TOKEN is not set: the admin key API needs it")
	}

	q := url.Values{"tenant": {*tenant}}
	method, path := http.MethodGet, "/v1/keys?"
	var reqBody io.Reader
	switch op {
	case "delete":
		method = http.MethodDelete
		q.Set("key", *key)
	case "get":
		q.Set("key", *key)
	case "list":
		if *limit != 0 {
			q.Set("limit", strconv.Itoa(*limit))
		}
		if *cursor != "" {
			q.Set("cursor", *cursor)
		}
		if *state != "" {
			q.Set("state", *state)
		}
	case "resolve":
		method, path = http.MethodPost, "/v1/keys/resolve?"
		q.Set("key", *key)
		b, _ := json.Marshal(proxy.Resolution{Status: *status, CommandID: *command})
		reqBody = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path+q.Encode(), reqBody)
	if err != nil {
		return fmt.Errorf("keys %s: %w", op, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	switch {
	case resp.StatusCode == http.StatusNoContent:
		fmt.Fprintf(stdout, "deleted tenant %s key %q\n", *tenant, *key)
		return nil
	case resp.StatusCode == http.StatusOK && (op == "get" || op == "resolve") && !*asJSON:
		var view proxy.KeyView
		if err := json.Unmarshal(body, &view); err != nil {
			return fmt.Errorf("admin API: unreadable key: %w", err)
		}
		return printKeys(stdout, []proxy.KeyView{view})
	case resp.StatusCode == http.StatusOK && op == "list":
		return printKeyList(stdout, stderr, body, *asJSON, nextPage(fs))
	case resp.StatusCode == http.StatusOK:
		_, err := stdout.Write(body)
		return err
	default:
		return fmt.Errorf("admin API answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
}

// printKeyList prints a page of the admin API's listing, as a table
// followed by the command for the next page if there is one, or as the
// JSON it is with that command on stderr. next is that command without
// the cursor.
func printKeyList(stdout, stderr io.Writer, body []byte, asJSON bool, next string) error {
	var page proxy.KeyList
	if err := json.Unmarshal(body, &page); err != nil {
		return fmt.Errorf("admin API: unreadable listing: %w", err)
	}
	more := stdout
	if asJSON {
		if _, err := stdout.Write(body); err != nil {
			return err
		}
		more = stderr
	} else {
		if err := printKeys(stdout, page.Keys); err != nil {
			return err
		}
		if len(page.Keys) == 0 {
			fmt.Fprintln(stdout, "(no live keys)")
		}
	}
	if page.NextCursor != "" {
		fmt.Fprintf(more, "more: %s -cursor %s\n", next, shellQuote(page.NextCursor))
	}
	return nil
}

// printKeys prints keys as a table.
func printKeys(w io.Writer, keys []proxy.KeyView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tSTATUS\tCREATED\tEXPIRES\tCOMMAND")
	for _, k := range keys {
		status := "-"
		if k.Status != 0 {
			status = strconv.Itoa(k.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s %s\n", k.Key, k.State, status,
			k.CreatedAt.Format(time.RFC3339), k.ExpiresAt.Format(time.RFC3339), k.CommandType, k.CommandID)
	}
	return tw.Flush()
}

// nextPage is the keys list command that fs parsed, without -cursor: the
// flags given, which the next page needs again.
func nextPage(fs *flag.FlagSet) string {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	cmd := []string{"idemproxy", "keys", "list"}
	for _, name := range []string{"tenant", "state", "limit", "json", "admin"} {
		switch {
		case !given[name]:
		case name == "json":
			cmd = append(cmd, "-json")
		default:
			cmd = append(cmd, "-"+name, shellQuote(fs.Lookup(name).Value.String()))
		}
	}
	return strings.Join(cmd, " ")
}

// shellQuote quotes s for a POSIX shell, unless it needs no quotes.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@=,+%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// adminURL turns the admin listener's address into its base URL: a
// host:port as IDEMPROXY_ADMIN_ADDR takes it (an empty or unspecified
// host means this machine), or an http or https URL. Empty means :9090.
func adminURL(addr string) (string, error) {
	if addr == "" {
		addr = ":9090"
	}
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return "", fmt.Errorf("%q is not a URL: %v", addr, errors.Unwrap(err))
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("%q: want host:port (as in IDEMPROXY_ADMIN_ADDR) or an http:// URL", addr)
		}
		return strings.TrimRight(u.String(), "/"), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: want host:port (as in IDEMPROXY_ADMIN_ADDR, e.g. 127.0.0.1:9090) or an http:// URL", addr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
