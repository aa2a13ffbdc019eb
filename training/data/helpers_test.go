package data

import (
	"log/slog"
	"path/filepath"
	"testing"
)

// testDataFile returns the path of a file in the repository's testdata/data.
func testDataFile(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join("..", "..", "testdata", "data", name)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
