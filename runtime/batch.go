package runtime

import "context"

// Each runs the model on a batch of id sequences like Logits, but hands
// each sequence's logits to fn instead of copying them: l.Data is valid only
// while fn runs. Sequences that need the same exported length share
// onnxruntime calls, as many per call as that graph's static batch
// (BatchSize) holds, so a batch of n sequences of one length group costs
// ceil(n/BatchSize) calls. fn is called from the calling goroutine, once
// per sequence, in no particular order; an error from fn stops the run.
func (m *Model) Each(ctx context.Context, batch [][]int32, fn func(i int, l Logits) error) error {
	V := m.man.VocabSize
	return m.forEach(ctx, batch, func(i int, logits []float32) error {
		n := len(batch[i])
		return fn(i, Logits{Len: n, Vocab: V, Data: logits[:n*V]})
	})
}

// NextLogits returns, for each sequence of batch, the logits of the token
// after its last position (a copy of row len-1), grouped into onnxruntime
// calls as Each does: what one step of batched decoding needs.
func (m *Model) NextLogits(ctx context.Context, batch [][]int32) ([][]float32, error) {
	out := make([][]float32, len(batch))
	err := m.Each(ctx, batch, func(i int, l Logits) error {
		out[i] = append([]float32(nil), l.Row(l.Len-1)...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// BatchSize is the static batch of the exported graphs (the sequences one
// onnxruntime call holds; the smallest, should the graphs differ); 0 for a
// closed model.
func (m *Model) BatchSize() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b := 0
	for _, g := range m.graphs {
		if b == 0 || g.batch < b {
			b = g.batch
		}
	}
	return b
}
