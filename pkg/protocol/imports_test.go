package protocol

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The contract must stay readable without any NATS client or toolrelay
// package: it may import the standard library and uuid, nothing else.
func TestImportsOnlyStdlibAndUUID(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range ast.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			if path != "github.com/google/uuid" && strings.Contains(first, ".") {
				t.Errorf("%s imports %s: package protocol may import only the standard library and github.com/google/uuid", f, path)
			}
		}
	}
}
