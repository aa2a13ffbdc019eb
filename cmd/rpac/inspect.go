package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/rpac-dev/rpac/compiler/export"
	"github.com/rpac-dev/rpac/compiler/onnx"
	"github.com/rpac-dev/rpac/runtime"
	"github.com/rpac-dev/rpac/training"
	"github.com/rpac-dev/rpac/training/checkpoint"
	"github.com/urfave/cli/v2"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "describe an ONNX file, an export folder, or a checkpoint (directory, run directory or model.safetensors)",
		ArgsUsage: "FILE",
		Action: func(c *cli.Context) error {
			if c.Args().Len() != 1 {
				return errors.New("inspect takes one FILE: an .onnx file, an export folder, a run or checkpoint directory, or a .safetensors file")
			}
			return inspect(c.App.Writer, c.Args().First())
		},
	}
}

func inspect(w io.Writer, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("inspect %s: %v", path, errors.Unwrap(err))
	}
	if st.IsDir() {
		switch {
		case exists(filepath.Join(path, runtime.ManifestName)):
			return inspectExport(w, path)
		case exists(filepath.Join(path, checkpoint.ManifestFile)):
			return inspectCheckpoint(w, path)
		case exists(filepath.Join(path, "checkpoint", checkpoint.ManifestFile)):
			return inspectCheckpoint(w, filepath.Join(path, "checkpoint"))
		}
		return fmt.Errorf("inspect %s: the folder holds no %s (export) and no %s (checkpoint)", path, runtime.ManifestName, checkpoint.ManifestFile)
	}
	switch {
	case strings.HasSuffix(path, ".safetensors"):
		if exists(filepath.Join(filepath.Dir(path), checkpoint.ManifestFile)) {
			return inspectCheckpoint(w, filepath.Dir(path))
		}
		ts, _, err := checkpoint.LoadWeightsFile(path)
		if err != nil {
			return err
		}
		describeTensors(w, ts)
		return nil
	case filepath.Base(path) == runtime.ManifestName:
		return inspectExport(w, filepath.Dir(path))
	}
	return inspectONNX(w, path)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func inspectONNX(w io.Writer, path string) error {
	m, err := onnx.Read(path)
	if err != nil {
		return err
	}
	s := onnx.Inspect(m)
	fmt.Fprintf(w, "file       %s\n", path)
	if l := s.Metadata["lengths"]; l != "" {
		fmt.Fprintf(w, "lengths    %s (this file: %s)\n", l, s.Metadata["length"])
	}
	io.WriteString(w, s.String())
	if js := s.Metadata["provenance"]; js != "" {
		var p runtime.Provenance
		if json.Unmarshal([]byte(js), &p) == nil {
			printProvenance(w, &p)
		}
	}
	if f := s.Metadata["fold"]; f != "" {
		var fold export.Fold
		if json.Unmarshal([]byte(f), &fold) == nil {
			printFold(w, fold)
		}
	}
	return nil
}

func printFold(w io.Writer, f export.Fold) {
	fmt.Fprintf(w, "fold       %s, attention %s", f.Mode, f.Attention)
	if len(f.Calibrated) > 0 {
		fmt.Fprintf(w, ", calibrated lengths %v on %d×%d chunks of %s", f.Calibrated, f.CalibBatches, f.CalibBatch, f.CalibSource)
	}
	fmt.Fprintln(w)
	for _, l := range f.Layers {
		fmt.Fprintf(w, "  L=%-5d layer %2d  bias [%+.3f, %+.3f] mean %+.3f  clipped %.2f%%\n", l.T, l.Layer, l.Min, l.Max, l.Mean, 100*l.ClipFrac)
	}
}

// printProvenance describes where an export came from (what it records).
func printProvenance(w io.Writer, p *runtime.Provenance) {
	if p.Weights != "" || p.Checkpoint != "" {
		fmt.Fprintf(w, "source     %s weights at step %d of %s\n", orDash(p.Weights), p.Step, orDash(p.Checkpoint))
	}
	if p.Dataset != "" {
		fmt.Fprintf(w, "data       %s", p.Dataset)
		if p.TrainSplit != "" || p.EvalSplit != "" {
			fmt.Fprintf(w, ", trained on %s, evaluated on %s", orDash(p.TrainSplit), orDash(p.EvalSplit))
		}
		if p.DataDir != "" {
			fmt.Fprintf(w, " (%s)", p.DataDir)
		}
		if len(p.Synthetic) > 0 {
			fmt.Fprintf(w, " seed %d, options %s", p.Seed, compactJSON(p.Synthetic))
		}
		fmt.Fprintln(w)
	}
	if p.Fold != "" {
		q := p.Quantize
		if q == "" {
			q = "none"
		}
		fmt.Fprintf(w, "compiled   fold %s, attention %s, precision %s, quantize %s\n", p.Fold, p.Attention, orDash(p.Precision), q)
	}
	if p.Commit != "" {
		fmt.Fprintf(w, "commit     %s\n", p.Commit)
	}
}

func inspectExport(w io.Writer, dir string) error {
	man, err := runtime.ReadManifest(dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "export     %s\n", dir)
	fmt.Fprintf(w, "model      %s\n", man.Model)
	fmt.Fprintf(w, "lengths    %v\n", man.SortedLengths())
	fmt.Fprintf(w, "vocabulary %d (tokenizer %s, eos %d)\n", man.VocabSize, man.Tokenizer, man.EOS)
	if len(man.Config) > 0 {
		fmt.Fprintf(w, "config     %s\n", compactJSON(man.Config))
	}
	printProvenance(w, man.Origin())
	if len(man.Fold) > 0 {
		var fold export.Fold
		if err := json.Unmarshal(man.Fold, &fold); err == nil {
			printFold(w, fold)
		}
	}
	if k := man.KVCache; k != nil {
		fmt.Fprintf(w, "kv cache   %s, %d layers × %d heads × head size %d, prefill and decode graphs at %v\n", k.Layout, k.Layers, k.Heads, k.HeadSize, k.Lengths)
	}
	for _, f := range man.Files {
		kind := ""
		if f.Graph != runtime.GraphFull {
			kind = "  (" + string(f.Graph) + ")"
		}
		fmt.Fprintf(w, "file       L=%-5d %s  %.1f MiB  sha256 %s%s\n", f.Length, f.Path, float64(f.Bytes)/(1<<20), f.SHA256[:min(16, len(f.SHA256))], kind)
	}
	if err := runtime.Check(context.Background(), dir); err != nil {
		return err
	}
	fmt.Fprintln(w, "hashes     ok (and the graphs' inputs, outputs, sizes and finite weights, as runtime.Open checks them)")
	for _, L := range man.SortedLengths() {
		f, _ := man.ModelFile(L)
		fmt.Fprintln(w)
		if err := inspectONNX(w, filepath.Join(dir, filepath.FromSlash(f.Path))); err != nil {
			return err
		}
	}
	return nil
}

func compactJSON(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func inspectCheckpoint(w io.Writer, dir string) error {
	run, err := training.OpenRun(dir)
	if err != nil {
		// Fall back to a plain listing when the weights do not match a
		// model (still useful to see what the file holds).
		ts, _, lerr := checkpoint.LoadWeightsFile(filepath.Join(dir, checkpoint.ModelFile))
		if lerr != nil {
			return err
		}
		fmt.Fprintf(w, "checkpoint %s\n", dir)
		describeTensors(w, ts)
		return fmt.Errorf("the tensors above do not open as an rpac run: %w", err)
	}
	ct := run.Contents()
	fmt.Fprintf(w, "checkpoint %s\n", dir)
	s := run.State
	fmt.Fprintf(w, "model      %s (preset %s), step %d, trained at context %d batch %d\n", run.Config.Model, orDash(s.Preset), s.Step, s.Context, s.Batch)
	if s.Dataset != "" {
		fmt.Fprintf(w, "data       %s (%s)\n", s.Dataset, s.Protocol)
	}
	fmt.Fprintf(w, "parameters %d in %d tensors (%d tensors in the file)\n", ct.Params, ct.ParamTensors, ct.Tensors)
	ls, trained := ct.Lengths, ct.Trained
	fmt.Fprintf(w, "lengths    running statistics stored for %v, trained for %v (max_len %d)\n", ls, trained, run.Config.MaxLen)
	fmt.Fprintf(w, "weights    last")
	for _, g := range []training.WeightSet{training.WeightsEMA, training.WeightsSWA} {
		if n := ct.Averaged[g]; n > 0 {
			fmt.Fprintf(w, ", %s (%d tensors)", g, n)
		}
	}
	fmt.Fprintln(w)
	if ct.Guardian > 0 {
		fmt.Fprintf(w, "training   guardian policy (%d tensors; never exported)\n", ct.Guardian)
	}
	cj, _ := json.Marshal(run.Config)
	fmt.Fprintf(w, "config     %s\n", cj)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func describeTensors(w io.Writer, ts []checkpoint.Named) {
	var n int64
	for _, t := range ts {
		n += int64(t.Numel())
	}
	fmt.Fprintf(w, "tensors    %d (%d values)\n", len(ts), n)
	for i, t := range ts {
		if i == 20 {
			fmt.Fprintf(w, "  ... %d more\n", len(ts)-20)
			break
		}
		fmt.Fprintf(w, "  %-48s %v\n", t.Name, t.Shape)
	}
}
