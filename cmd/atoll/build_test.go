package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/server"
)

// writeFiles makes the files of name/content pairs under dir.
func writeFiles(t *testing.T, dir string, files ...string) {
	t.Helper()
	for i := 0; i+1 < len(files); i += 2 {
		p := filepath.Join(dir, files[i])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(files[i+1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tarEntries lists a tar stream's entries as "name", "name -> target" for
// links, and "name: content" for files under 100 bytes.
func tarEntries(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			out = append(out, h.Name+" -> "+h.Linkname)
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			out = append(out, h.Name+": "+string(b))
		default:
			out = append(out, h.Name)
		}
	}
}

func TestBuildContextTar(t *testing.T) {
	// Not t.TempDir: a socket's path must be short.
	dir, err := os.MkdirTemp("", "ctx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	outside := t.TempDir()
	writeFiles(t, outside, "secret", "outside")
	writeFiles(t, dir,
		"docker/Dockerfile", "FROM alpine",
		"src/main.go", "package main",
		"src/debug.log", "noise",
		"keep.log", "kept",
		"node_modules/x/index.js", "js",
		"build/out/a.o", "obj",
		"build/README", "kept by !",
		".dockerignore", "# comments and blank lines are skipped\n\n*.log\n**/*.log\n!keep.log\n/node_modules\n./build\n!build/README\ndocker\n",
	)
	os.Symlink("src/main.go", filepath.Join(dir, "link"))
	os.Symlink(outside, filepath.Join(dir, "out-dir"))
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "out-file"))
	ln, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	bc, err := newBuildContext(dir, filepath.Join(dir, "docker/Dockerfile"), ".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	if bc.dockerfile != "docker/Dockerfile" {
		t.Errorf("dockerfile %q, want docker/Dockerfile", bc.dockerfile)
	}
	var buf bytes.Buffer
	if err := bc.write(&buf); err != nil {
		t.Fatal(err)
	}
	want := []string{
		".dockerignore: # comments and blank lines are skipped\n\n*.log\n**/*.log\n!keep.log\n/node_modules\n./build\n!build/README\ndocker\n",
		"build/README: kept by !",
		// The Dockerfile goes even though "docker" leaves out its directory.
		"docker/Dockerfile: FROM alpine",
		"keep.log: kept",
		"link -> src/main.go",
		"out-dir -> " + outside,
		"out-file -> " + filepath.Join(outside, "secret"),
		"src/",
		"src/main.go: package main",
	}
	if diff := cmp.Diff(want, tarEntries(t, &buf)); diff != "" {
		t.Errorf("context (-want +got):\n%s", diff)
	}

	// Without the ignore file everything but the socket goes.
	bc, err = newBuildContext(dir, filepath.Join(dir, "docker/Dockerfile"), "")
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	bc.write(&buf)
	got := tarEntries(t, &buf)
	if len(got) != 17 || strings.Contains(strings.Join(got, "\n"), "sock") {
		t.Errorf("context without .dockerignore: %q", got)
	}
}

func TestBuildContextRefuses(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ctx")
	writeFiles(t, root, "Dockerfile", "FROM alpine", "ctx/app.py", "", "other/Dockerfile", "FROM alpine", "bad/.dockerignore", "[")
	writeFiles(t, root, "bad/Dockerfile", "FROM alpine", "nodf/x", "")
	os.Symlink(filepath.Join(root, "other"), filepath.Join(dir, "via"))
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	t.Chdir(root)
	for _, tc := range []struct {
		name, dir, file, want string
	}{
		{"Dockerfile above DIR", dir, filepath.Join(root, "Dockerfile"), "is not inside the build context"},
		{"relative Dockerfile above DIR", "ctx", "Dockerfile", "is not inside the build context"},
		{"Dockerfile in a sibling", "ctx", "ctx/../other/Dockerfile", "is not inside the build context"},
		{"Dockerfile is DIR", "ctx", "ctx", "is not inside the build context"},
		{"Dockerfile through a link", "ctx", "ctx/via/Dockerfile", "reached through a symbolic link"},
		{"Dockerfile is a directory", "ctx", "ctx/sub", "not a regular file"},
		{"no Dockerfile", "nodf", "", "nodf/Dockerfile: no such file"},
		{"DIR is a file", "Dockerfile", "", "not a directory"},
		{"no DIR", "nope", "", "no such file"},
		{"bad .dockerignore", "bad", "", `bad/.dockerignore: line 1: "[": syntax error in pattern`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newBuildContext(tc.dir, tc.file, ".dockerignore")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestBuildCommand drives "atoll template build" against a server in this
// process.
func TestBuildCommand(t *testing.T) {
	tpls := newMemTemplates(0)
	cli := cliAgainst(t, server.Config{Sandboxes: noSandboxes{}, Templates: tpls})
	run := func(args ...string) (stdout, stderr string, err error) {
		t.Helper()
		return cli("", append([]string{"template", "build"}, args...)...)
	}

	root := t.TempDir()
	writeFiles(t, root,
		"app/Dockerfile", "FROM alpine # cached\nRUN make\nCOPY . /app",
		"app/ci/Dockerfile", "FROM alpine\nRUN false\nRUN make",
		"app/main.c", "int main;",
	)
	t.Setenv("FROM_ENV", "env value")

	var stderr string
	t.Run("build", func(t *testing.T) {
		t.Chdir(root) // for -f, relative to it; golden files are not
		var stdout string
		var err error
		stdout, stderr, err = run("-f", "app/Dockerfile", "--name", "app", "--build-arg", "V=1", "--build-arg", "EQ=a=b", "--build-arg", "FROM_ENV", "--build-arg", "UNSET_IN_ENV", "app")
		if err != nil {
			t.Fatalf("%v; stderr %s", err, stderr)
		}
		if stdout != "app\n" {
			t.Errorf("stdout %q, want the name", stdout)
		}
	})
	golden(t, "build-output", stderr)
	got, _ := tpls.Get(context.Background(), "app")
	want := api.Template{
		Name: "app", Source: "build", CreatedAt: got.CreatedAt,
		Layers: []string{"Dockerfile", "ci/", "ci/Dockerfile", "main.c"},
		Env:    []string{"EQ=a=b", "FROM_ENV=env value", "V=1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("template (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name       string
		args       []string
		want       string
		wantStderr string
	}{
		{"failing step", []string{"-f", "app/ci/Dockerfile", "--name", "ci", "app"}, "building ci: invalid argument: step 2: RUN false: exit status 1",
			"Step 1/3: FROM alpine\nStep 2/3: RUN false\nrunning false\n"},
		{"no name", []string{"app"}, `required flag(s) "name" not set`, ""},
		{"bad name", []string{"--name", "App", "app"}, "malformed template name", ""},
		{"name taken", []string{"--name", "app", "app"}, "building app: template app already exists", ""},
		{"Dockerfile outside DIR", []string{"-f", "app/Dockerfile", "--name", "x", "app/ci"}, "is not inside the build context", ""},
		{"empty build arg", []string{"--name", "x", "--build-arg", "=1", "app"}, `--build-arg "=1": want K=V or K`, ""},
		{"two DIRs", []string{"--name", "x", "app", "app"}, "accepts 1 arg(s), received 2", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(root)
			_, stderr, err := run(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
			if tc.wantStderr != "" && stderr != tc.wantStderr {
				t.Errorf("stderr %q, want %q", stderr, tc.wantStderr)
			}
		})
	}
}

func TestBuildOutput(t *testing.T) {
	var b bytes.Buffer
	o := &buildOutput{w: &b}
	for _, ev := range []api.BuildEvent{
		{Type: "step", Step: 1, Steps: 2, Instruction: "FROM alpine", Cached: true},
		{Type: "step", Step: 2, Instruction: "RUN echo -n hi"},
		{Type: "log", Step: 2, Data: []byte("hi")},
		{Type: "log", Step: 2},
		{Type: "step", Step: 3, Steps: 3, Instruction: "RUN printf 'a\\nb'"},
		{Type: "log", Step: 3, Data: []byte("a\nb")},
	} {
		o.event(ev)
	}
	o.finish()
	want := "Step 1/2: FROM alpine (cached)\nStep 2: RUN echo -n hi\nhi\nStep 3/3: RUN printf 'a\\nb'\na\nb\n"
	if b.String() != want {
		t.Errorf("output %q, want %q", b.String(), want)
	}
}
