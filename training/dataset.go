package training

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/rpac-dev/rpac/training/data"
)

// Dataset is a training id stream and an evaluation id stream.
type Dataset struct {
	Name     string // wikitext2 | synthetic
	Protocol string // for people: e.g. "train on test, evaluate on valid"
	// TrainSplit is the WikiText-2 split of Train ("" for the synthetic
	// corpus); EvalName names Eval.
	TrainSplit string
	EvalName   string
	Vocab      int
	Train      []int32
	Eval       []int32
	Synthetic  *data.SyntheticCorpus // set for the synthetic corpus
	MQAR       *data.MQARCorpus      // set for the MQAR corpus
	// Answers marks the answer positions of Eval (nil: no recall is
	// scored); evaluations report recall_acc on them.
	Answers *data.AnswerStream
	// Align, when above 1, makes training chunks start at multiples of it
	// (the generated corpora's sequence length), so that every chunk begins
	// with a whole sequence's pairs.
	Align int
	// Dir is the WikiText-2 directory the splits came from (absolute).
	Dir string
}

// DataSpec names a run's data.
type DataSpec struct {
	Name                  string // wikitext2 (default) | synthetic | mqar
	Dir                   string // WikiText-2 directory ("" = the usual lookup)
	TrainSplit, EvalSplit string
	Seed                  uint64               // the synthetic corpus's seed
	Synthetic             data.SyntheticConfig // the synthetic corpus's shape (zero: defaults)
	MQAR                  data.MQARConfig      // the MQAR corpus's shape (zero: defaults)
}

// LoadDataset resolves and encodes the data of a run.
// Downloads report on log (nil: slog.Default()).
func LoadDataset(ctx context.Context, spec DataSpec, log *slog.Logger) (*Dataset, error) {
	name, dir, trainSplit, evalSplit, seed := spec.Name, spec.Dir, spec.TrainSplit, spec.EvalSplit, spec.Seed
	switch name {
	case "", "wikitext2":
		if trainSplit == "" {
			trainSplit = "train"
		}
		if evalSplit == "" {
			evalSplit = "valid"
		}
		for _, s := range []string{trainSplit, evalSplit} {
			if _, err := data.SplitFileName(s); err != nil {
				return nil, err
			}
		}
		loc := data.Locator{DataDir: dir, Log: log}
		d, err := loc.Locate(ctx)
		if err != nil {
			return nil, err
		}
		tok := data.NewTokenizer()
		tr, err := data.LoadWikiText2(d, trainSplit, tok)
		if err != nil {
			return nil, err
		}
		ev, err := data.LoadWikiText2(d, evalSplit, tok)
		if err != nil {
			return nil, err
		}
		if abs, err := filepath.Abs(d); err == nil {
			d = abs
		}
		return &Dataset{Name: "wikitext2", Protocol: fmt.Sprintf("train on %s, evaluate on %s", trainSplit, evalSplit),
			TrainSplit: trainSplit, EvalName: evalSplit, Vocab: tok.VocabSize(), Train: tr, Eval: ev, Dir: d}, nil
	case "synthetic":
		c, err := data.NewSyntheticCorpus(int64(seed), 1<<20, 1<<16, spec.Synthetic)
		if err != nil {
			return nil, err
		}
		sc := spec.Synthetic.WithDefaults()
		return &Dataset{Name: "synthetic", Protocol: fmt.Sprintf("synthetic long-span recall corpus (sequences of %d tokens, %d pairs, query ≥ %d tokens after its statement; train and eval streams from different seeds)", sc.SeqLen, sc.Pairs, sc.MinGap),
			EvalName: "synthetic-eval", Vocab: data.SyntheticVocab, Train: c.Train.IDs, Eval: c.Eval.IDs, Synthetic: c,
			Answers: &c.Eval.AnswerStream}, nil
	case "mqar":
		c, err := data.NewMQARCorpus(int64(seed), MQARTrainTokens, MQAREvalTokens, spec.MQAR)
		if err != nil {
			return nil, err
		}
		mc := spec.MQAR.WithDefaults()
		return &Dataset{Name: "mqar", Protocol: fmt.Sprintf("MQAR multi-query associative recall (sequences of %d tokens, %d pairs, %s, query distance %d–%d, vocab %d; train and eval streams from different seeds)", mc.SeqLen, mc.Pairs, mc.Draw.Phrase(), mc.MinDist, mc.MaxDist, mc.Vocab),
			EvalName: "mqar-eval", Vocab: mc.Vocab, Train: c.Train.IDs, Eval: c.Eval.IDs, MQAR: c,
			Answers: &c.Eval.AnswerStream, Align: mc.SeqLen}, nil
	}
	return nil, fmt.Errorf("unknown dataset %q (choose wikitext2, synthetic or mqar)", name)
}

// The MQAR corpus's stream sizes: the train stream is large enough that a
// run of a few thousand steps rarely sees a sequence twice (4M tokens), the
// eval stream is 256K tokens. rpac eval reads the same streams through
// LoadSplit.
const (
	MQARTrainTokens = 1 << 22
	MQAREvalTokens  = 1 << 18
)

// TrainLen is the number of training tokens.
func (d *Dataset) TrainLen() int { return len(d.Train) }

// EvalLen is the number of evaluation tokens.
func (d *Dataset) EvalLen() int { return len(d.Eval) }

// EvalChunks is the number of full evaluation chunks of context T.
func (d *Dataset) EvalChunks(T int) int { return data.NumChunks(len(d.Eval), T) }
