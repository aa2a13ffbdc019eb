package cuda

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// GEMM algorithm choices. A plan takes the algorithm cuBLASLt's heuristic
// ranks first unless a choices file names another rank for its key:
//
//	Options{GEMMAlgos: FILE}                 use FILE's ranks (a key it lacks: rank 0)
//	Options{GEMMAlgos: FILE, GEMMTune: true} also time the candidates of every key FILE
//	                                         lacks when its plan is made, take the
//	                                         fastest and add it to FILE
//
// (RPAC_CUDA_GEMM_ALGOS=FILE and RPAC_CUDA_GEMM_TUNE=1 on the command line,
// OptionsFromEnv.)
//
// The choice is stored, not timed again: with the same file a step runs
// the same algorithms, so it repeats bit for bit across processes (two
// algorithms may sum in different orders, so runs with and without the
// file differ in the last bits). A file belongs to one device: used on
// another it is refused. Candidates that do not agree with rank 0 to
// gemmTuneAgree are never chosen.

// GemmChoices is a choices file's content.
type GemmChoices struct {
	Device string `json:"device"`
	// Keys: per GEMM key (GemmKey.String) the chosen rank and the
	// candidates' times when they were measured here.
	Keys map[string]GemmChoice `json:"keys"`
}

// GemmChoice is one key's choice.
type GemmChoice struct {
	Rank    int       `json:"rank"`
	Seconds []float64 `json:"seconds,omitempty"` // each candidate's median time, by rank
}

// gemmTuneAlgos and gemmTuneReps bound the timing of one key: the
// heuristic's first gemmTuneAlgos candidates, each the median of
// gemmTuneReps runs after a warm-up.
const (
	gemmTuneAlgos = 8
	gemmTuneReps  = 5
	// gemmTuneAgree: a candidate's result may differ from rank 0's by at
	// most this much relative to max |C| (summation order in fp32).
	gemmTuneAgree = 1e-4
	// gemmTuneMaxBytes: keys whose operands take more are not timed
	// (their scratch copies are allocated for the timing).
	gemmTuneMaxBytes = 2 << 30
)

// gemmChooser applies a choices file to the plans of one GPU.
type gemmChooser struct {
	path string
	tune bool
	mu   sync.Mutex
	file GemmChoices
}

// newGemmChooser is the choices file o names for the device named
// device: nil when it names none.
func newGemmChooser(o Options, device string) (*gemmChooser, error) {
	if o.GEMMAlgos == "" {
		return nil, nil
	}
	return loadGemmChooser(o.GEMMAlgos, device, o.GEMMTune)
}

// loadGemmChooser reads the choices at path for device; a missing file is
// an empty one when tuning (it is created), an error otherwise.
func loadGemmChooser(path, device string, tune bool) (*gemmChooser, error) {
	c := &gemmChooser{path: path, tune: tune, file: GemmChoices{Device: device, Keys: map[string]GemmChoice{}}}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && tune:
		return c, nil
	case err != nil:
		return nil, fmt.Errorf("RPAC_CUDA_GEMM_ALGOS: %w", err)
	}
	if err := json.Unmarshal(b, &c.file); err != nil {
		return nil, fmt.Errorf("RPAC_CUDA_GEMM_ALGOS: %s: %w", path, err)
	}
	if c.file.Device != device {
		return nil, fmt.Errorf("RPAC_CUDA_GEMM_ALGOS: %s holds choices for %q, this device is %q", path, c.file.Device, device)
	}
	if c.file.Keys == nil {
		c.file.Keys = map[string]GemmChoice{}
	}
	for k, ch := range c.file.Keys {
		if ch.Rank < 0 {
			return nil, fmt.Errorf("RPAC_CUDA_GEMM_ALGOS: %s: rank %d for %s", path, ch.Rank, k)
		}
	}
	return c, nil
}

// rank is the algorithm rank for key k: the file's, else (tuning) the
// fastest of its candidates, timed by time and added to the file, else 0.
func (c *gemmChooser) rank(k GemmKey, time func(GemmKey) ([]AlgoTime, error)) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name := k.String()
	if ch, ok := c.file.Keys[name]; ok {
		return ch.Rank, nil
	}
	if !c.tune || gemmKeyBytes(k) > gemmTuneMaxBytes {
		return 0, nil
	}
	ts, err := time(k)
	if err != nil {
		return 0, fmt.Errorf("timing the algorithms of GEMM %s: %w", name, err)
	}
	ch := fastest(ts)
	c.file.Keys[name] = ch
	return ch.Rank, c.save()
}

// fastest is the choice among timed candidates: the quickest of those
// that agree with rank 0.
func fastest(ts []AlgoTime) GemmChoice {
	ch := GemmChoice{Seconds: make([]float64, len(ts))}
	for i, t := range ts {
		ch.Seconds[i] = t.Seconds
		if t.MaxDiff <= gemmTuneAgree && t.Seconds < ts[ch.Rank].Seconds {
			ch.Rank = i
		}
	}
	return ch
}

// save writes the file whole (a new file renamed over the old one).
func (c *gemmChooser) save() error {
	b, err := json.MarshalIndent(c.file, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".gemm-algos-*")
	if err != nil {
		return fmt.Errorf("RPAC_CUDA_GEMM_ALGOS: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), c.path)
}

// gemmKeyBytes is the bytes of k's operands A, B and C (all matrices of the
// batch).
func gemmKeyBytes(k GemmKey) int64 {
	a, b, c := gemmKeyElems(k.Shape)
	size := int64(4)
	if k.AB == BF16 {
		size = 2
	}
	return size*(a+b) + k.C.Size()*c
}

// gemmKeyElems is the elements A, B and C span: the last matrix of the
// batch starts (Batch−1)·stride after the first.
func gemmKeyElems(s GemmShape) (a, b, c int64) {
	ra, _ := s.StoredA()
	rb, _ := s.StoredB()
	last := int64(max(1, s.Batch) - 1)
	return last*s.StrideA + int64(ra*s.LeadingA()), last*s.StrideB + int64(rb*s.LeadingB()), last*s.StrideC + int64(s.M*s.LeadingC())
}
