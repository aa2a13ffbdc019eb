// Package layering holds the test that checks rpac's package layers
// (docs/DESIGN.md, "Layers and what each may import"): it parses the
// imports of every non-test Go file of the module and checks each rule
// against the transitive imports of the packages it covers.
package layering
