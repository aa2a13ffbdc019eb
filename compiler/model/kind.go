package model

import "github.com/rpac-dev/rpac/internal/enum"

// Kind is the model a Config builds; config.json, checkpoints and manifests
// spell it "fuzzy" or "baseline".
type Kind uint8

const (
	KindUnset Kind = iota // no model named (a Config must name one)
	Fuzzy                 // the FuzzyTransformer: fuzzy gating, expert mixture, the RPA prior
	Baseline              // the plain transformer
)

var kindNames = enum.Names[Kind]{"", "fuzzy", "baseline"}

func (k Kind) String() string { return kindNames.String("model", k) }

// ParseKind reads a model kind: fuzzy or baseline.
func ParseKind(s string) (Kind, error) { return kindNames.Parse("--model", s) }

// MarshalText writes the kind's spelling.
func (k Kind) MarshalText() ([]byte, error) { return kindNames.Marshal("model", k) }

// UnmarshalText reads the kind's spelling.
func (k *Kind) UnmarshalText(b []byte) error { return kindNames.Unmarshal("model", k, b) }
