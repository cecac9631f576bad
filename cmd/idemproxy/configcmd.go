package main

import (
	"fmt"
	"io"
	"net/url"
)

// secretVars are the variables whose values `idemproxy config` never
// prints; urlVars are printed with their password hidden.
var (
	secretVars = map[string]bool{"IDEMPROXY_JWT_HS256_SECRET": true, "IDEMPROXY_ADMIN_TOKEN": true}
	urlVars    = map[string]bool{"IDEMPROXY_DATABASE_URL": true, "IDEMPROXY_REDIS_URL": true}
)

// runConfig is the config command: it reads the configuration from
// environ as the proxy would, prints every variable with the value in
// force (given, or the default), one NAME=value line each, then the drain
// budget, and prints the warnings to stderr. An invalid configuration is
// an error, as it would be at start. Secrets are printed as "(set)", URLs
// with their password hidden.
func runConfig(environ []string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(environ)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	for _, w := range configWarnings(environ, cfg) {
		fmt.Fprintln(stderr, "warning:", w)
	}
	set := environMap(environ)
	for _, v := range variables() {
		value, given := set[v.name]
		if !given || value == "" {
			value = v.def
		}
		switch {
		case value == "":
		case secretVars[v.name]:
			value = "(set)"
		case urlVars[v.name]:
			if u, err := url.Parse(value); err == nil && u.User != nil {
				value = u.Redacted()
			}
		}
		fmt.Fprintf(stdout, "%s=%s\n", v.name, value)
	}
	fmt.Fprintf(stdout, "# drain budget: %s (the longest a graceful shutdown takes; an orchestrator's grace period must cover it)\n",
		cfg.drainBudget())
	return nil
}
