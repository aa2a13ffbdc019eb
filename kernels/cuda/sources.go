package cuda

import (
	"embed"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/rpac-dev/rpac/kernels/cuda/driver"
)

//go:embed src/*.cu src/prelude.cuh
var sourceFS embed.FS

// SourceNames lists the embedded kernel sources (file names under src/).
func SourceNames() []string {
	ents, _ := sourceFS.ReadDir("src")
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// prelude is src/prelude.cuh with its elementwise section generated
// (ewSource).
func prelude() (string, error) {
	pre, err := sourceFS.ReadFile("src/prelude.cuh")
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(pre), ewMarker) {
		return "", fmt.Errorf("src/prelude.cuh lacks the line %q", ewMarker)
	}
	return strings.Replace(string(pre), ewMarker, ewSource(), 1), nil
}

// Source returns the complete translation unit of one kernel source: the
// shared prelude followed by the file.
func Source(name string) (string, error) {
	pre, err := prelude()
	if err != nil {
		return "", err
	}
	body, err := sourceFS.ReadFile("src/" + name)
	if err != nil {
		return "", fmt.Errorf("no kernel source %q (have %s)", name, strings.Join(SourceNames(), ", "))
	}
	src := pre + "\n#line 1 \"" + name + "\"\n" + string(body)
	if plantHook != nil {
		src = plantHook(src)
	}
	return src, nil
}

// plantHook, set only by tests, rewrites every kernel source (the planted
// defects the simulator tests must catch).
var plantHook func(string) string

var entryRE = regexp.MustCompile(`extern "C" __global__ (?:__launch_bounds__\([^)]*\) )?void (\w+)\(`)

// Entries lists the kernels a source defines.
func Entries(name string) ([]string, error) {
	src, err := Source(name)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range entryRE.FindAllStringSubmatch(src, -1) {
		out = append(out, m[1])
	}
	return out, nil
}

// KernelSources is every embedded kernel source as the driver loads it:
// its translation unit and its kernels.
func KernelSources() ([]driver.Source, error) {
	var out []driver.Source
	for _, name := range SourceNames() {
		src, err := Source(name)
		if err != nil {
			return nil, err
		}
		entries, err := Entries(name)
		if err != nil {
			return nil, err
		}
		out = append(out, driver.Source{Name: name, Text: src, Entries: entries})
	}
	return out, nil
}

// Probe reports what this machine offers the backend, every embedded
// kernel source compiled for its first device (driver.Probe).
func Probe() driver.Report {
	srcs, err := KernelSources()
	if err != nil {
		return driver.Report{Kernels: map[string]string{"sources": err.Error()}}
	}
	return driver.Probe(srcs)
}
