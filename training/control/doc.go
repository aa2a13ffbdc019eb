// Package control holds the training-time controllers of the paper
// (Sections 4-5, Algorithm 1, Appendix C): Guardian (a REINFORCE-trained
// Gaussian policy that nudges the attention temperature τ_att and two
// penalty weights), the scripted temperature schedule of Algorithm 1, the
// context game over context lengths (a replicator/logit dynamic), the chaos
// controller (logistic map), bias warm-in, dropout glide, the EMA of the
// weights and SWA-select.
//
// Controllers act between optimizer steps on plain numbers and float32
// slices; none of them is ever part of a model graph, and none of their state
// is a model parameter. Every controller is a plain struct whose exported
// fields are its whole state, so a run's state.json can hold it and a resumed
// run continues exactly where it stopped. Random draws come from RNG, a PCG
// generator whose state is part of that JSON.
//
// Guardian's policy gradient is computed by this package's own small
// reverse-mode autodiff (Tape), checked against finite differences in the
// tests.
package control
