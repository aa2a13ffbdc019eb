package training

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"

	"github.com/rpac-dev/rpac/runtime/manifest"
	"github.com/rpac-dev/rpac/training/data"
)

// ExportData is the data an export's ids come from, as its provenance
// records it: the dataset its tokenizer implies (or dataset, when given),
// the run's WikiText-2 directory while it still exists, and the run's seed
// and corpus shape. Seeded reports whether the provenance recorded the
// generated corpus the spec names (its seed is then the run's).
func ExportData(prov *manifest.Provenance, dataset string) (spec DataSpec, seeded bool, err error) {
	if dataset == "" {
		if dataset, err = datasetOfTokenizer(prov.Tokenizer); err != nil {
			return DataSpec{}, false, err
		}
	}
	spec = DataSpec{Name: dataset}
	switch dataset {
	case "wikitext2":
		if _, err := os.Stat(prov.DataDir); prov.DataDir != "" && err == nil {
			spec.Dir = prov.DataDir
		}
	case "synthetic":
		seeded, err = decodeCorpus("synthetic", prov.Synthetic, &spec.Synthetic)
	case "mqar":
		seeded, err = decodeCorpus("MQAR", prov.MQAR, &spec.MQAR)
	default:
		return DataSpec{}, false, fmt.Errorf("--dataset %q: want wikitext2, synthetic or mqar", dataset)
	}
	if seeded {
		spec.Seed = prov.Seed
	}
	return spec, seeded, err
}

func datasetOfTokenizer(tokenizer string) (string, error) {
	switch tokenizer {
	case data.GPT2TokenizerName:
		return "wikitext2", nil
	case "synthetic", "mqar":
		return tokenizer, nil
	}
	return "", fmt.Errorf("the export's tokenizer %q is not one this build knows (%s, synthetic or mqar); pass --dataset to say which data its ids come from", tokenizer, data.GPT2TokenizerName)
}

// decodeCorpus reads a recorded corpus shape; it reports whether there
// was one.
func decodeCorpus(what string, js json.RawMessage, cfg any) (bool, error) {
	if len(js) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(js, cfg); err != nil {
		return false, fmt.Errorf("the export's manifest records a bad %s corpus %s: %v", what, js, err)
	}
	return true, nil
}

// LoadSplit returns the ids of one split of spec's data and its name
// ("wikitext2 valid", "synthetic eval"): a WikiText-2 split (train, valid,
// test), or a generated corpus's eval (also "valid") or train stream, the
// streams LoadDataset trains and evaluates on.
func LoadSplit(ctx context.Context, spec DataSpec, split string, log *slog.Logger) ([]int32, string, error) {
	if spec.Name == "" || spec.Name == "wikitext2" {
		if _, err := data.SplitFileName(split); err != nil {
			return nil, "", err
		}
		loc := data.Locator{DataDir: spec.Dir, Log: log}
		dir, err := loc.Locate(ctx)
		if err != nil {
			return nil, "", err
		}
		ids, err := data.LoadWikiText2(dir, split, data.NewTokenizer())
		return ids, "wikitext2 " + split, err
	}
	if split != "eval" && split != "valid" && split != "train" {
		return nil, "", fmt.Errorf("--split %q: the %s corpus has eval and train", split, corpusName(spec.Name))
	}
	ds, err := LoadDataset(ctx, spec, log)
	if err != nil {
		return nil, "", err
	}
	if split == "train" {
		return ds.Train, spec.Name + " train", nil
	}
	return ds.Eval, spec.Name + " eval", nil
}

func corpusName(name string) string {
	if name == "mqar" {
		return "MQAR"
	}
	return name
}
