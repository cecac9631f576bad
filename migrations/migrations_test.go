package migrations

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

// TestFiles checks that the migrations are numbered 1, 2, 3… without gaps
// and that each has an Up and a Down section, in that order.
func TestFiles(t *testing.T) {
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("no migrations embedded")
	}
	for i, name := range names {
		if want := fmt.Sprintf("%05d_", i+1); !strings.HasPrefix(name, want) {
			t.Errorf("migration %d is %s, want a name starting %s", i+1, name, want)
		}
		b, err := fs.ReadFile(FS, name)
		if err != nil {
			t.Fatal(err)
		}
		sql := string(b)
		up, down := strings.Index(sql, "-- +goose Up"), strings.Index(sql, "-- +goose Down")
		if up < 0 || down < 0 || down < up {
			t.Errorf("%s: want a -- +goose Up section followed by a -- +goose Down section", name)
		}
	}
}
