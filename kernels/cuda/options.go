package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rpac-dev/rpac/internal/enum"
)

// Options chooses the backend's paths where more than one computes the
// same thing. DefaultOptions are the paths a GPU measured fastest: a path
// no GPU has measured stays off, behind its field, until a lease measures it
// (CandidateOptions turns them on; scripts/gpu-lease.sh runs both). The
// others are kept to compare against on a GPU (scripts/gpu-check.sh) and as
// the tests' second opinion. Each field's path is described where it is
// implemented.
type Options struct {
	// Attention is the tensor-core attention path under bf16 GEMMs
	// (attngemm.go): AttentionGEMM where its work buffer fits, else
	// flash.cu's kernels; AttentionFlash: flash.cu's always.
	Attention AttentionPath
	// JoinGrads: the train pipeline joins sibling Linears' backward GEMMs
	// (joincat.go).
	JoinGrads bool
	// Pack: producers write the bf16 copies bf16 GEMMs read (packed.go).
	Pack bool
	// Sums: chains fold the column sums of their results (chainsum.go).
	Sums bool
	// HeadPad: the LM head's GEMMs run over the vocabulary and the model
	// width rounded up to 8 (ops.go, growDims).
	HeadPad bool
	// PadGradW: weight gradients run over their dims rounded up to 8
	// (ops.go, gemmPaddedGradW).
	PadGradW bool
	// PadModel: under bf16 GEMMs, train and eval graphs store the model's
	// widths padded to multiples of 8 (Capabilities.Align). cuBLASLt runs
	// its Hopper kernels only when M, N and K are all multiples of 8 (the
	// sixth run: 24576x1024x512 in 0.071 ms, 24576x1020x510 in 0.146 on
	// its fallback kernels). The paper preset's widths are 510, 85 and
	// 1,020; the graphs hold them as 512, 88 and 1,024 with zero padding
	// (compiler/model's Opts.Align: exact, the parameters keep their
	// shapes), so every GEMM over them has aligned dims.
	PadModel bool
	// AGLean: the GEMM attention's lean stores (attngemm.go).
	AGLean bool
	// BF16Act: under bf16 GEMMs, a GEMM result that only elementwise
	// chains read (at the paper preset the experts' up projections and
	// the input gradients of their down projections) is rounded to bf16 in
	// the GEMM's epilogue and stored so (packed.go, halfOutput): the chains
	// read half the bytes; the values are rounded once more than in fp32.
	BF16Act bool
	// Remat: a Dropout whose result several fused chains read is drawn
	// again in each of them (passes.FuseElementwiseRemat; at the paper
	// preset the experts' output dropouts, which the gates' mixture and
	// the gates' gradients read) instead of written once by dropout_f32
	// and read by each. Both give the same bits.
	Remat bool
	// CESmem: the fused softmax cross-entropy keeps each row of logits in
	// shared memory where it fits (softmax_ce_smem_f32: the logits read
	// from DRAM once) instead of reading them twice (softmax_ce_fused_f32).
	// Both give the same bits.
	CESmem bool
	// LNFused: LayerNorm's backward over rows up to 512 wide in one kernel
	// (layernorm_bwd_f32: dy and x read once for dx and the parameters'
	// partial sums) instead of two (layernorm_bwd_dx_f32 and
	// layernorm_bwd_params_f32, the path of wider rows). Both give the same
	// sums in the same order up to the partials' chunking.
	LNFused bool
	// AGSave: the GEMM attention's forward keeps its packed bf16 q, k, v
	// for the backward (saveAGPacks, at most agSavedCap), which then packs
	// nothing. The same bits.
	AGSave bool
	// GEMMAlgos names a GEMM algorithm choices file (gemmtune.go; "":
	// every plan takes cuBLASLt's first algorithm); GEMMTune also times the
	// candidates of the keys the file lacks and adds the fastest to it.
	GEMMAlgos string
	GEMMTune  bool
	// Sync synchronizes after every launch and GEMM and names the kernel
	// that failed (debugging).
	Sync bool
}

// DefaultOptions are the paths the backend takes unless told otherwise:
// those the sixth GPU run (an H200, 2026-11-27) measured, and none that
// came after it (Unmeasured).
func DefaultOptions() Options {
	return Options{Attention: AttentionGEMM, JoinGrads: true, Pack: true, Sums: true, HeadPad: true}
}

// CandidateOptions are DefaultOptions with every Unmeasured path on: the
// code as the performance model predicts it, which a lease measures beside
// the defaults before any of it becomes a default.
func CandidateOptions() Options {
	o := DefaultOptions()
	for _, p := range Unmeasured() {
		o.Set(p, true)
	}
	return o
}

// Path names one of Options' on/off paths, for the command line
// (--cuda-path NAME=on|off) and the lease's reports.
type Path uint8

const (
	PathJoinGrads Path = iota // JoinGrads
	PathPack                  // Pack
	PathSums                  // Sums
	PathHeadPad               // HeadPad
	PathPadGradW              // PadGradW
	PathPadModel              // PadModel
	PathAGLean                // AGLean
	PathBF16Act               // BF16Act
	PathRemat                 // Remat
	PathCESmem                // CESmem
	PathLNFused               // LNFused
	PathAGSave                // AGSave
)

var pathNames = enum.Names[Path]{"join", "pack", "sums", "head-pad", "pad-gradw", "pad-model", "ag-lean", "bf16-act", "remat", "ce-smem",
	"ln-fused", "ag-save"}

func (p Path) String() string { return pathNames.String("cuda path", p) }

// PathList is the paths' names for a message: "join, pack, ... or ce-smem".
func PathList() string { return pathNames.List() }

// ParsePath reads a path's name (join, pack, ..., ce-smem).
func ParsePath(s string) (Path, error) { return pathNames.Parse("--cuda-path", s) }

// Unmeasured are the paths on no GPU has measured (they came after the
// sixth run): off by default. The smoke test of a lease runs their
// kernels first (the cross-entropy's 201 KB of shared memory, the bf16 GEMM
// results with an fp32 bias epilogue, the lean attention stores into a
// buffer zeroed once), then the paper step with them on and off.
func Unmeasured() []Path {
	return []Path{PathPadGradW, PathPadModel, PathAGLean, PathBF16Act, PathRemat, PathCESmem, PathLNFused, PathAGSave}
}

// field is the switch p names.
func (o *Options) field(p Path) *bool {
	return [...]*bool{&o.JoinGrads, &o.Pack, &o.Sums, &o.HeadPad, &o.PadGradW, &o.PadModel, &o.AGLean, &o.BF16Act, &o.Remat, &o.CESmem,
		&o.LNFused, &o.AGSave}[p]
}

// Set turns path p on or off.
func (o *Options) Set(p Path, on bool) { *o.field(p) = on }

// On reports whether path p is on.
func (o Options) On(p Path) bool { return *o.field(p) }

// ParsePathSetting reads NAME=on|off (the command line's --cuda-path).
func ParsePathSetting(s string) (Path, bool, error) {
	name, v, ok := strings.Cut(s, "=")
	if !ok || (v != "on" && v != "off") {
		return 0, false, fmt.Errorf("--cuda-path %q: want NAME=on or NAME=off (NAME: %s)", s, pathNames.List())
	}
	p, err := ParsePath(name)
	return p, v == "on", err
}

// Describe lists the on/off paths and their settings, "join=on pack=on
// ...", for logs and reports.
func (o Options) Describe() string {
	var b strings.Builder
	for p := range Path(len(pathNames)) {
		if p > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", p, map[bool]string{true: "on", false: "off"}[o.On(p)])
	}
	return b.String()
}

// Validate refuses options that cannot go together.
func (o Options) Validate() error {
	if o.Attention > AttentionFlash {
		return fmt.Errorf("attention path %d: want gemm or flash", o.Attention)
	}
	if o.GEMMTune && o.GEMMAlgos == "" {
		return errors.New("GEMM tuning (RPAC_CUDA_GEMM_TUNE=1) needs a choices file (RPAC_CUDA_GEMM_ALGOS=FILE), the file the choices go to")
	}
	return nil
}

// OptionsFromEnv is the one place the backend's paths are read from the
// environment, for experiments: the command line calls it with
// DefaultOptions, and a variable that is set overrides base's field.
//
//	RPAC_CUDA_ATTENTION=gemm|flash  Attention
//	RPAC_CUDA_JOIN=on|off           JoinGrads
//	RPAC_CUDA_PACK=on|off           Pack
//	RPAC_CUDA_SUMS=on|off           Sums
//	RPAC_CUDA_HEAD_PAD=on|off       HeadPad
//	RPAC_CUDA_PAD_GRADW=on|off      PadGradW
//	RPAC_CUDA_PAD_MODEL=on|off      PadModel
//	RPAC_CUDA_AG_LEAN=on|off        AGLean
//	RPAC_CUDA_BF16_ACT=on|off       BF16Act
//	RPAC_CUDA_REMAT=on|off          Remat
//	RPAC_CUDA_CE_SMEM=on|off        CESmem
//	RPAC_CUDA_GEMM_ALGOS=FILE       GEMMAlgos
//	RPAC_CUDA_GEMM_TUNE=1|0         GEMMTune
//	RPAC_CUDA_SYNC=1                Sync
//
// Any other value is refused, naming the variable. RPAC_CUDA_SPLITK and
// RPAC_CUDA_FUSED chose paths since removed (rpac's split-K, the chain
// interpreter); set, they are refused rather than ignored.
//
// The variables that say where things are, not which path to take, are
// read where they are used, by every caller: RPAC_CUDA_LIBS (the folders
// searched for the CUDA libraries first, driver.SearchDirs),
// RPAC_CUDA_CACHE (the compiled kernels' cache, driver.CacheDir),
// RPAC_CUDA_PTX=1 (load PTX instead of cubins, driver.NVRTC.DeviceImage),
// RPAC_CUDA_DUMP_GEN=DIR (write each generated chain source there,
// fused.go) and RPAC_CUDA_SIM (the simulator, cudasim).
func OptionsFromEnv(base Options) (Options, error) {
	o := base
	for _, gone := range []string{"RPAC_CUDA_SPLITK", "RPAC_CUDA_FUSED"} {
		if v := os.Getenv(gone); v != "" {
			return o, fmt.Errorf("%s=%s: the path it chose was removed (measured slower on an H200)", gone, v)
		}
	}
	if v := os.Getenv("RPAC_CUDA_ATTENTION"); v != "" {
		p, ok := map[string]AttentionPath{"gemm": AttentionGEMM, "flash": AttentionFlash}[v]
		if !ok {
			return o, fmt.Errorf("RPAC_CUDA_ATTENTION=%q: want gemm (the default: the scores through cuBLASLt) or flash (flash.cu's kernels)", v)
		}
		o.Attention = p
	}
	onOff := map[string]bool{"on": true, "off": false}
	for _, s := range []struct {
		name string
		on   *bool
	}{
		{"RPAC_CUDA_JOIN", &o.JoinGrads}, {"RPAC_CUDA_PACK", &o.Pack}, {"RPAC_CUDA_SUMS", &o.Sums},
		{"RPAC_CUDA_HEAD_PAD", &o.HeadPad}, {"RPAC_CUDA_PAD_GRADW", &o.PadGradW}, {"RPAC_CUDA_PAD_MODEL", &o.PadModel},
		{"RPAC_CUDA_AG_LEAN", &o.AGLean}, {"RPAC_CUDA_BF16_ACT", &o.BF16Act}, {"RPAC_CUDA_REMAT", &o.Remat},
		{"RPAC_CUDA_CE_SMEM", &o.CESmem},
	} {
		if err := envBool(s.name, onOff, s.on); err != nil {
			return o, err
		}
	}
	if v := os.Getenv("RPAC_CUDA_GEMM_ALGOS"); v != "" {
		o.GEMMAlgos = v
	}
	if err := envBool("RPAC_CUDA_GEMM_TUNE", map[string]bool{"1": true, "0": false}, &o.GEMMTune); err != nil {
		return o, err
	}
	if err := envBool("RPAC_CUDA_SYNC", map[string]bool{"1": true, "0": false}, &o.Sync); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// envBool sets *on from variable name when it is set: one of values' keys,
// any other value refused.
func envBool(name string, values map[string]bool, on *bool) error {
	v := os.Getenv(name)
	if v == "" {
		return nil
	}
	b, ok := values[v]
	if !ok {
		keys := "on or off"
		if _, one := values["1"]; one {
			keys = "1 or 0"
		}
		return fmt.Errorf("%s=%q: want %s", name, v, keys)
	}
	*on = b
	return nil
}
