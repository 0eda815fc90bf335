package templates

import (
	"archive/tar"
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestContext(t *testing.T) {
	if !slices.Equal(Names(), []string{"base", "code-interpreter"}) {
		t.Errorf("Names() = %v", Names())
	}
	b, ok := Context("base")
	if !ok {
		t.Fatal("no context for base")
	}
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	var dockerfile string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "Dockerfile" {
			d, _ := io.ReadAll(tr)
			dockerfile = string(d)
		}
	}
	if !slices.Equal(names, []string{"Dockerfile"}) {
		t.Errorf("base's context holds %v, want its Dockerfile at the root", names)
	}
	for _, want := range []string{"FROM debian\n", "LABEL atoll.setuid=true\n", "WORKDIR /home/user\n", "python-is-python3", "NOPASSWD"} {
		if !strings.Contains(dockerfile, want) {
			t.Errorf("base's Dockerfile lacks %q", want)
		}
	}
	// Only a template's own directory is a context.
	for _, name := range []string{"", ".", "..", "../base", "base/", "base/Dockerfile", "/base", "nope", "Base"} {
		if _, ok := Context(name); ok {
			t.Errorf("Context(%q) is a build context", name)
		}
	}
}
