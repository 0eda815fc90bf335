package e2b

import (
	"context"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/dockerfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestParseName(t *testing.T) {
	for _, c := range []struct {
		in, name, tag, ref, atoll string
		bad                       bool
	}{
		{in: "app", name: "app", ref: "app", atoll: "app"},
		{in: " App:V1 ", name: "app", tag: "v1", ref: "app.v1", atoll: "app.v1"},
		{in: "app:default", name: "app", ref: "app", atoll: "app"},
		{in: "app:v1.2", name: "app", tag: "v1.2", ref: "app.v1.2", atoll: "app.v1.2"},
		{in: "app:3", name: "app", tag: "3", ref: "app@3", atoll: "app.3"},
		{in: "app:v0123456789abcdef012", name: "app", tag: "v0123456789abcdef012", ref: "app@v0123456789abcdef012", atoll: "app.v0123456789abcdef012"},
		{in: "my_app-2", name: "my_app-2", ref: "my_app-2", atoll: "my_app-2"},
		{in: "team/app", bad: true},
		{in: "a.b", bad: true}, // E2B names have no dots: NAME.TAG stays unambiguous
		{in: "", bad: true},
		{in: "app:", bad: true},
		{in: "app:x y", bad: true},
		{in: "../x", bad: true},
	} {
		name, tag, err := parseName(c.in)
		if (err != nil) != c.bad {
			t.Errorf("parseName(%q): %v", c.in, err)
			continue
		}
		if c.bad {
			continue
		}
		if name != c.name || tag != c.tag || atollRef(name, tag) != c.ref || atollName(name, tag) != c.atoll {
			t.Errorf("parseName(%q) = %q, %q (ref %q, name %q)", c.in, name, tag, atollRef(name, tag), atollName(name, tag))
		}
	}
	for tag, ok := range map[string]bool{"v1": true, "stable": true, "1.0": true, "7": false, "v0123456789abcdef012": false,
		"0b6a1f0e-0000-4000-8000-000000000000": false, "A": false, "a b": false} {
		if err := checkTag(tag); (err == nil) != ok {
			t.Errorf("checkTag(%q): %v", tag, err)
		}
	}
}

func TestCopySource(t *testing.T) {
	for in, want := range map[string]string{
		"file.txt": "file.txt", "dir": "dir", "dir/": "dir", "dir/*.txt": "dir", "*.txt": ".",
		"a/b/**/c": "a/b", ".": ".", "./x": "./x", "dir/[ab].txt": "dir", "x/{a,b}": "x",
		"../x": "", "a/../../x": "", "/etc/passwd": "",
	} {
		got, err := copySource(in)
		if want == "" {
			if err == nil {
				t.Errorf("copySource(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("copySource(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// templates answers what translate asks: which templates and build files
// exist.
type templates struct {
	Templates
	names map[string]bool
	files map[string]bool
}

func (f templates) Get(ctx context.Context, name string) (api.Template, error) {
	if f.names[name] {
		return api.Template{Name: name}, nil
	}
	return api.Template{}, errdefs.ErrNotFound
}

func (f templates) HasBuildFiles(hash string) bool { return f.files[hash] }

func (f templates) AddBuildFiles(context.Context, string, io.Reader) error { return nil }

func TestTranslate(t *testing.T) {
	hash := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	s := &Server{cfg: Config{Aliases: map[string][]string{"base": {"host"}},
		Templates: templates{names: map[string]bool{"app.v1": true}, files: map[string]bool{hash: true}}}}
	ins, steps, err := s.translate(context.Background(), startBuildBody{
		FromTemplate: "base",
		Force:        true,
		Steps: []templateStep{
			{Type: "COPY", Args: []string{"dir/*.txt", "txt/", "", "0755"}, FilesHash: hash},
			{Type: "RUN", Args: []string{"make", "root"}},
			{Type: "WORKDIR", Args: []string{"app"}},
			{Type: "USER", Args: []string{"alice"}, Force: true},
			{Type: "RUN", Args: []string{"id"}},
			{Type: "ENV", Args: []string{"A", "1", "B", "2"}},
		},
		StartCmd: "serve", ReadyCmd: "check",
	})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Cmd   string
		Args  []string
		Flags map[string]string
		Step  string
	}
	var got []row
	for i, in := range ins {
		got = append(got, row{in.Cmd, in.Args, in.Flags, steps[i]})
	}
	want := []row{
		{"FROM", []string{"host"}, map[string]string{"force": "yes"}, "base"},
		{"COPY", []string{"dir", "/home/user/txt/"}, map[string]string{"chown": "user:user", "chmod": "0755", "files": hash}, "1"},
		{"RUN", []string{"make"}, map[string]string{"user": "root", "cwd": "/home/user"}, "2"},
		{"RUN", []string{workdirScript("/home/user/app", "user")}, map[string]string{"user": "root", "force": ""}, "3"},
		{"WORKDIR", []string{"/home/user/app"}, map[string]string{}, "3"},
		{"RUN", []string{"id -u alice >/dev/null 2>&1 || useradd --create-home --shell /bin/bash alice"}, map[string]string{"user": "root", "force": "yes"}, "4"},
		{"USER", []string{"alice"}, map[string]string{"force": "yes"}, "4"},
		{"RUN", []string{"id"}, map[string]string{"user": "alice", "cwd": "/home/user/app"}, "5"},
		{"ENV", []string{"A", "1", "B", "2"}, map[string]string{}, "6"},
		{"LABEL", []string{"atoll.start", "serve", "atoll.ready", "check"}, nil, "finalize"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("translate (-want +got):\n%s", d)
	}

	// A tag of another template is its atoll name; fromImage imports.
	for _, c := range []struct {
		body startBuildBody
		from dockerfile.Instruction
	}{
		{startBuildBody{FromTemplate: "app:v1"}, dockerfile.Instruction{Cmd: "FROM", Args: []string{"app.v1"}}},
		{startBuildBody{FromTemplate: "app:2"}, dockerfile.Instruction{Cmd: "FROM", Args: []string{"app@2"}}},
		{startBuildBody{FromImage: "e2bdev/base"}, dockerfile.Instruction{Cmd: "FROM", Args: []string{"host"}}},
		{startBuildBody{}, dockerfile.Instruction{Cmd: "FROM", Args: []string{"host"}}},
		{startBuildBody{FromImage: "ubuntu:22.04"}, dockerfile.Instruction{Cmd: "FROM", Args: []string{"ubuntu:22.04"}, Flags: map[string]string{"image": "yes"}}},
	} {
		ins, _, err := s.translate(context.Background(), c.body)
		if err != nil {
			t.Errorf("%+v: %v", c.body, err)
			continue
		}
		got, want := ins[0], c.from
		if got.Cmd != want.Cmd || !cmp.Equal(got.Args, want.Args) || got.Flags["image"] != want.Flags["image"] {
			t.Errorf("%+v: FROM %+v, want %+v", c.body, got, want)
		}
	}
	for _, body := range []startBuildBody{
		{FromTemplate: "nope"},
		{FromTemplate: "base:1"},
		{FromTemplate: "base", Steps: []templateStep{{Type: "COPY", Args: []string{"a", "b"}, FilesHash: "ab"}}},
		{FromTemplate: "base", Steps: []templateStep{{Type: "COPY", Args: []string{"a", "b"}, FilesHash: "1" + hash[1:]}}},
		{FromTemplate: "base", Steps: []templateStep{{Type: "USER", Args: []string{"$(reboot)"}}}},
		{FromTemplate: "base", Steps: []templateStep{{Type: "ENV", Args: []string{"A=B", "c"}}}},
		{FromTemplate: "base", Steps: []templateStep{{Type: "HEALTHCHECK"}}},
		{FromTemplate: "base", Steps: []templateStep{{Type: "COPY", Args: []string{"a", "b", "alice"}, FilesHash: hash}}},
	} {
		if _, _, err := s.translate(context.Background(), body); err == nil {
			t.Errorf("%+v: translated", body)
		}
	}
}
