package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy"
)

// Per-request policies. A program that applies different settings to
// different requests (the sidecar's route policies) derives a step per
// policy from one step with Derive: the derived steps share the store, the
// budget of buffered bytes, the background releases and the metrics, and
// differ in the settings Overrides names, the command type and where the
// key is read from.

// Overrides are the settings a derived step changes. A zero field keeps
// the setting of the step it is derived from.
type Overrides struct {
	Mode            Mode
	KeyTTL          time.Duration
	LockTimeout     time.Duration
	UpstreamTimeout time.Duration
	CommandTimeout  time.Duration
	// InFlightWait may be NoWait, to answer a duplicate at once.
	InFlightWait   time.Duration
	UnknownOutcome UnknownOutcome
	SuccessStatus  StatusSet
	// ReportOnly, when not nil, sets Config.ReportOnly: a route enforces
	// or only reports whatever the step it is derived from does.
	ReportOnly     *bool
	ReplayMaxBytes int64
	MaxBodyBytes   int64
	// RequireKey makes every non-safe request carry a key (400 without
	// one), whatever its method; false keeps Config.RequireKey.
	RequireKey bool
	// CommandType names every command of the derived step in its locks
	// and records (and so in strict replays and the admin API); empty
	// means "METHOD /path". At most 512 bytes are kept.
	CommandType string
	// Key says where a request's key is; the zero value is the
	// Idempotency-Key header.
	Key KeySource
}

// KeyIn is where a request carries its key.
type KeyIn int

// The places a key is read from.
const (
	// KeyInHeader: a header (Structured Field string or bare token,
	// like Idempotency-Key).
	KeyInHeader KeyIn = iota
	// KeyInQuery: a query parameter.
	KeyInQuery
	// KeyInBody: a member of a JSON body, named by an RFC 6901 pointer.
	// The body is read under the body rules (MaxBodyBytes, BodyTimeout,
	// MaxBufferedBytes) before the key is known; a string or a number is
	// the key (a number as its text: 42 and "42" name the same key, but
	// they are different bodies, so different fingerprints). A body that
	// is not JSON, or has no such member, carries no key.
	KeyInBody
)

// KeySource is where a request carries its key.
type KeySource struct {
	In KeyIn
	// Name is the header name (empty means Idempotency-Key), the query
	// parameter's name, or the JSON pointer ("/order_id").
	Name string
}

// String spells the source as header:NAME, query:NAME or json:/pointer.
func (k KeySource) String() string {
	switch k.In {
	case KeyInQuery:
		return "query:" + k.Name
	case KeyInBody:
		return "json:" + k.Name
	}
	if k.Name == "" {
		return "header:Idempotency-Key"
	}
	return "header:" + http.CanonicalHeaderKey(k.Name)
}

// ParseKeySource reads header:NAME, query:NAME or json:/pointer.
func ParseKeySource(s string) (KeySource, error) {
	where, name, ok := strings.Cut(s, ":")
	if !ok || name == "" {
		return KeySource{}, fmt.Errorf("must be header:NAME, query:NAME or json:/pointer, got %q", s)
	}
	var k KeySource
	switch strings.ToLower(where) {
	case "header":
		if !isToken(name) {
			return KeySource{}, fmt.Errorf("header:NAME needs a header field name, got %q", name)
		}
		k = KeySource{In: KeyInHeader, Name: http.CanonicalHeaderKey(name)}
		if k.Name == "Idempotency-Key" {
			k.Name = ""
		}
	case "query":
		k = KeySource{In: KeyInQuery, Name: name}
	case "json":
		if _, err := splitPointer(name); err != nil {
			return KeySource{}, err
		}
		k = KeySource{In: KeyInBody, Name: name}
	default:
		return KeySource{}, fmt.Errorf("must be header:NAME, query:NAME or json:/pointer, got %q", s)
	}
	return k, nil
}

// splitPointer returns the reference tokens of an RFC 6901 JSON pointer,
// unescaped.
func splitPointer(p string) ([]string, error) {
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("json:POINTER needs an RFC 6901 pointer starting with /, got %q", p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, fmt.Errorf("json:POINTER %q has a ~ that is neither ~0 nor ~1", p)
			}
		}
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// Apply returns c with every non-zero setting of o in place of its own.
func (c Config) Apply(o Overrides) Config {
	if o.Mode != "" {
		c.Mode = o.Mode
	}
	for _, d := range []struct{ to, from *time.Duration }{
		{&c.KeyTTL, &o.KeyTTL}, {&c.LockTimeout, &o.LockTimeout}, {&c.UpstreamTimeout, &o.UpstreamTimeout},
		{&c.CommandTimeout, &o.CommandTimeout}, {&c.InFlightWait, &o.InFlightWait},
	} {
		if *d.from != 0 {
			*d.to = *d.from
		}
	}
	if o.CommandTimeout == 0 && o.UpstreamTimeout > c.CommandTimeout {
		// The command timeout is never below the upstream timeout.
		c.CommandTimeout = o.UpstreamTimeout
	}
	if o.UnknownOutcome != "" {
		c.UnknownOutcome = o.UnknownOutcome
	}
	if o.ReportOnly != nil {
		c.ReportOnly = *o.ReportOnly
	}
	if !o.SuccessStatus.empty() {
		c.SuccessStatus = o.SuccessStatus
	}
	if o.ReplayMaxBytes != 0 {
		c.ReplayMaxBytes = o.ReplayMaxBytes
	}
	if o.MaxBodyBytes != 0 {
		c.MaxBodyBytes = o.MaxBodyBytes
	}
	return c
}

// Derive returns a step with o applied to g's settings. It shares g's
// store, budget of buffered bytes, background work, metrics and logger;
// closing g closes it. The settings are validated as New does (the lease
// must exceed twice StoreTimeout, a body must fit the budget).
func (g *Step) Derive(o Overrides) (*Step, error) {
	cfg := g.cfg.Apply(o)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Key.In == KeyInBody {
		if _, err := splitPointer(o.Key.Name); err != nil {
			return nil, &idemproxy.ConfigError{Struct: "idempotency.Overrides", Field: "Key", Reason: err.Error()}
		}
	}
	d := *g
	d.cfg = cfg
	d.route = &routePolicy{commandType: o.CommandType, key: o.Key, requireAll: o.RequireKey}
	if o.Key.In == KeyInBody {
		d.route.pointer, _ = splitPointer(o.Key.Name)
	}
	return &d, nil
}

// routePolicy is what a derived step does differently from New's: nil
// for a step made by New.
type routePolicy struct {
	commandType string
	key         KeySource
	pointer     []string // of a body key
	requireAll  bool
}

// requiresKey reports whether a non-safe request with method m (upper
// case) must carry a key.
func (g *Step) requiresKey(m string) bool {
	return g.require[m] || (g.route != nil && g.route.requireAll)
}

// hasKey reports whether r carries a key where the step reads it.
func (g *Step) hasKey(r *http.Request) bool {
	if g.route == nil {
		_, keyed := r.Header["Idempotency-Key"]
		return keyed
	}
	switch k := g.route.key; k.In {
	case KeyInQuery:
		return r.URL.Query().Has(k.Name)
	case KeyInBody:
		pb := preparedFrom(r.Context())
		return pb != nil && pb.found
	default:
		_, keyed := r.Header[g.headerName()]
		return keyed
	}
}

func (g *Step) headerName() string {
	if g.route == nil || g.route.key.Name == "" {
		return "Idempotency-Key"
	}
	return g.route.key.Name
}

// requestKey returns the key r carries: found is false when it carries
// none, err says why a key that is there is not a valid one.
func (g *Step) requestKey(r *http.Request) (key string, found bool, err error) {
	if g.route == nil {
		values, keyed := r.Header["Idempotency-Key"]
		if !keyed {
			return "", false, nil
		}
		key, err = ParseKey(values)
		return key, true, err
	}
	switch k := g.route.key; k.In {
	case KeyInQuery:
		values, keyed := r.URL.Query()[k.Name]
		if !keyed {
			return "", false, nil
		}
		for _, v := range values[1:] {
			if v != values[0] {
				return "", true, fmt.Errorf("several %s query parameters that differ", k.Name)
			}
		}
		return values[0], true, checkKey(values[0], "query parameter "+k.Name)
	case KeyInBody:
		pb := preparedFrom(r.Context())
		if pb == nil || !pb.found {
			return "", false, nil
		}
		return pb.key, true, pb.keyErr
	default:
		values, keyed := r.Header[g.headerName()]
		if !keyed {
			return "", false, nil
		}
		key, err = ParseKey(values)
		if err != nil && g.headerName() != "Idempotency-Key" {
			err = errors.New(strings.ReplaceAll(err.Error(), "Idempotency-Key", g.headerName()))
		}
		return key, true, err
	}
}

// keyRequired is the detail of the 400 for a request that must carry a key
// and does not.
func (g *Step) keyRequired(r *http.Request) string {
	if g.route == nil || (g.route.key == KeySource{}) {
		return fmt.Sprintf("%s requests must carry an Idempotency-Key header", r.Method)
	}
	switch k := g.route.key; k.In {
	case KeyInQuery:
		return fmt.Sprintf("this request must carry its idempotency key in the query parameter %s", k.Name)
	case KeyInBody:
		return fmt.Sprintf("this request must carry its idempotency key in a JSON body, at %s (a string or a number)", k.Name)
	default:
		return fmt.Sprintf("this request must carry its idempotency key in the %s header", k.Name)
	}
}

// checkKey applies the key syntax (1–255 printable ASCII characters
// without leading or trailing space) to a key read from where.
func checkKey(key, where string) error {
	switch {
	case key == "":
		return fmt.Errorf("the key in %s is empty", where)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("the key in %s is %d bytes long, the limit is %d", where, len(key), MaxKeyLen)
	case key[0] == ' ' || key[len(key)-1] == ' ':
		return fmt.Errorf("the key in %s has leading or trailing space", where)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("the key in %s has a byte 0x%02x at position %d: only printable ASCII (0x20-0x7E) is allowed", where, c, i)
		}
	}
	return nil
}

// commandTypeOf is the command type of a request with method and
// (escaped) path.
func (g *Step) commandTypeOf(method, path string) string {
	if g.route != nil && g.route.commandType != "" {
		return cutCommandType(g.route.commandType)
	}
	return commandType(method, path)
}

// preparedBody is a body read before the key was known, and the key found
// in it.
type preparedBody struct {
	body   []byte
	reader *bodyReader // nil for an empty body
	key    string
	found  bool
	keyErr error
}

type preparedKey struct{}

func preparedFrom(ctx context.Context) *preparedBody {
	pb, _ := ctx.Value(preparedKey{}).(*preparedBody)
	return pb
}

// bodyFirst readies r for Checked and begin when the step reads the key from
// the body of a non-safe request: it reads the body (MaxBodyBytes,
// BodyTimeout, MaxBufferedBytes, answering 413, 408 or 503 as begin
// would, and returning ok false) and looks for the key in it. The
// request it returns carries the body read, for begin or, when the
// request is not checked, for the handler; done gives the body's buffer
// back to the budget, once the request is over. For every other step and
// request it returns r itself. In report-only (Config.ReportOnly) it
// answers nothing: a body that enforcement would refuse goes on as it
// arrived, and the request is then not checked.
func (g *Step) bodyFirst(w http.ResponseWriter, r *http.Request) (out *http.Request, done func(), ok bool) {
	if g.route == nil || g.route.key.In != KeyInBody || safeMethods[strings.ToUpper(r.Method)] {
		return r, func() {}, true
	}
	if g.cfg.ReportOnly {
		return g.prepareReport(r)
	}
	body, reader, prob := g.readBody(w, r)
	if prob != nil {
		g.reject(w, InfoFrom(r.Context()), prob)
		return nil, nil, false
	}
	out, done = g.prepared(r, body, reader)
	return out, done, true
}

// prepared is r carrying a body read before the key was known, and the
// key found in it; done gives the body's buffer back.
func (g *Step) prepared(r *http.Request, body []byte, reader *bodyReader) (out *http.Request, done func()) {
	pb := &preparedBody{body: body, reader: reader}
	pb.key, pb.found, pb.keyErr = bodyKey(body, g.route.pointer, g.route.key.Name)
	out = r.WithContext(context.WithValue(r.Context(), preparedKey{}, pb))
	out.Body = http.NoBody
	if reader != nil {
		out.Body = reader
	}
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	return out, func() {
		if reader != nil {
			reader.Close()
		}
	}
}

// bodyKey finds the member at pointer in a JSON body: a string or a
// number is the key; a body that is not JSON, or lacks the member, carries
// none; another JSON type is an invalid key. Of members with the same
// name the last counts, as when the body is decoded with encoding/json.
//
// The body is never decoded into a tree: json.Valid checks it (and so
// bounds its nesting, as encoding/json does), then a walk over its tokens
// follows the pointer and skips every other value token by token, so
// reading a key costs little memory beyond the body's own buffer however
// large the values around it.
func bodyKey(body []byte, pointer []string, name string) (key string, found bool, err error) {
	if !json.Valid(body) {
		return "", false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	v, found, err := findPointer(dec, pointer, true)
	if err != nil || !found {
		return "", false, nil
	}
	where := "the JSON body at " + name
	switch k := v.(type) {
	case string:
		return k, true, checkKey(k, where)
	case json.Number:
		return k.String(), true, checkKey(k.String(), where)
	case nil:
		return "", true, fmt.Errorf("the key in %s is null: it must be a string or a number", where)
	default:
		return "", true, fmt.Errorf("the key in %s is a JSON %s: it must be a string or a number", where, jsonType(k))
	}
}

// findPointer reads the next value from dec and returns the token at
// pointer within it (a json.Delim for an object or an array). It reads
// the value whole, unless last says that nothing after it matters: then
// it stops once the answer is known.
func findPointer(dec *json.Decoder, pointer []string, last bool) (v json.Token, found bool, err error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, false, err
	}
	if len(pointer) == 0 {
		if d, ok := tok.(json.Delim); ok {
			return d, true, skipRest(dec)
		}
		return tok, true, nil
	}
	switch tok {
	case json.Delim('{'):
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, false, err
			}
			if name != pointer[0] {
				if err := skipValue(dec); err != nil {
					return nil, false, err
				}
				continue
			}
			// A later member of the same name replaces this one.
			if v, found, err = findPointer(dec, pointer[1:], false); err != nil {
				return nil, false, err
			}
		}
	case json.Delim('['):
		want, err := strconv.Atoi(pointer[0])
		if err != nil || want < 0 || (len(pointer[0]) > 1 && pointer[0][0] == '0') {
			want = -1
		}
		for i := 0; dec.More(); i++ {
			if i != want {
				if want < 0 && last {
					return nil, false, nil
				}
				if err := skipValue(dec); err != nil {
					return nil, false, err
				}
				continue
			}
			if v, found, err = findPointer(dec, pointer[1:], last); err != nil || last {
				return v, found, err
			}
		}
	default:
		return nil, false, nil
	}
	_, err = dec.Token() // the closing delimiter
	return v, found, err
}

// skipValue reads the next value from dec, token by token.
func skipValue(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if _, ok := tok.(json.Delim); ok {
		return skipRest(dec)
	}
	return nil
}

// skipRest reads the rest of the object or array whose opening delimiter
// dec has just read.
func skipRest(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

func jsonType(v json.Token) string {
	switch v {
	case json.Delim('{'):
		return "object"
	case json.Delim('['):
		return "array"
	}
	if _, ok := v.(bool); ok {
		return "boolean"
	}
	return "value"
}

// requestBody is the body of a checked request: the one bodyFirst read, or
// read now.
func (g *Step) requestBody(w http.ResponseWriter, r *http.Request) ([]byte, *bodyReader, *idemproxy.Problem) {
	if pb := preparedFrom(r.Context()); pb != nil {
		return pb.body, pb.reader, nil
	}
	return g.readBody(w, r)
}

// String lists the set as ParseStatusSet reads it: whole classes as 2xx,
// other codes one by one.
func (s StatusSet) String() string {
	var items []string
	for class := 200; class < 600; class += 100 {
		whole := true
		for c := class; c < class+100; c++ {
			whole = whole && s.Contains(c)
		}
		if whole {
			items = append(items, strconv.Itoa(class/100)+"xx")
			continue
		}
		for c := class; c < class+100; c++ {
			if s.Contains(c) {
				items = append(items, strconv.Itoa(c))
			}
		}
	}
	return strings.Join(items, ",")
}
