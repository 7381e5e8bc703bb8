// Package tools exists so that this module has a package; the binaries it builds are named by
// the `tool` lines of go.mod.
package tools
