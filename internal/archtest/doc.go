// Package archtest checks the package graph against the layers that
// docs/architecture.md states: no import from a lower layer to a higher one,
// and no package without a layer. It has only tests.
package archtest
