// Package tools exists so that this module has a package; go.mod names the binaries.
package tools
