package proxy_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a
// leaked command, sweeper, pool or connection.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
