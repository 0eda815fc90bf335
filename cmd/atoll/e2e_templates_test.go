package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// helloSource is a static program for test images: it prints what the image
// config set up (env, working directory, uid) and whether paths exist.
const helloSource = `package main

import (
	"fmt"
	"os"
)

func main() {
	wd, _ := os.Getwd()
	fmt.Println(os.Getenv("GREETING"), wd, os.Getuid())
	for _, p := range os.Args[1:] {
		_, err := os.Stat(p)
		fmt.Println(p, err == nil)
	}
}
`

// testImage builds a two-layer image: a static binary, passwd with an "app"
// user, a file and a directory that the second layer deletes and empties.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	dir := testenv.Dir(t)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(helloSource), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644)
	build := exec.Command("go", "build", "-o", "hello", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hello: %v: %s", err, out)
	}
	bin, _ := os.ReadFile(filepath.Join(dir, "hello"))
	layer := func(entries ...tarEntry) v1.Layer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
			if e.dir {
				h.Typeflag, h.Size = tar.TypeDir, 0
			}
			tw.WriteHeader(h)
			tw.Write([]byte(e.body))
		}
		tw.Close()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	base := layer(
		tarEntry{name: "bin/", dir: true, mode: 0o755},
		tarEntry{name: "bin/hello", mode: 0o755, body: string(bin)},
		tarEntry{name: "etc/", dir: true, mode: 0o755},
		tarEntry{name: "etc/passwd", mode: 0o644, body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/app:/bin/sh\n"},
		tarEntry{name: "etc/group", mode: 0o644, body: "root:x:0:\napp:x:1234:\n"},
		tarEntry{name: "etc/gone.txt", mode: 0o644, body: "deleted above"},
		tarEntry{name: "data/", dir: true, mode: 0o755},
		tarEntry{name: "data/old.txt", mode: 0o644, body: "hidden by an opaque dir"},
		tarEntry{name: "app/", dir: true, mode: 0o755, uid: 1234},
	)
	top := layer(
		tarEntry{name: "etc/.wh.gone.txt", mode: 0o644},
		tarEntry{name: "data/", dir: true, mode: 0o755},
		tarEntry{name: "data/.wh..wh..opq", mode: 0o644},
		tarEntry{name: "data/new.txt", mode: 0o644, body: "new"},
	)
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.Config.Env = []string{"PATH=/bin", "GREETING=from-image"}
	cfg.Config.WorkingDir = "/app"
	cfg.Config.User = "app"
	cfg.Config.Cmd = []string{"hello"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

type tarEntry struct {
	name, body string
	mode       int64
	uid        int
	dir        bool
}

// TestTemplateManyLayers imports an image of 120 layers, more than one page
// of overlay mount options names, and starts a sandbox that sees every
// layer; an image of more layers than an overlay stacks is refused with a
// 400 and leaves no template.
func TestTemplateManyLayers(t *testing.T) {
	_, _, c := startRooted(t)
	ctx := context.Background()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	push := func(tag string, n int) string {
		t.Helper()
		var ls []v1.Layer
		for i := range n {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			body := fmt.Sprint(i)
			tw.WriteHeader(&tar.Header{Name: "many/", Mode: 0o755, Typeflag: tar.TypeDir})
			tw.WriteHeader(&tar.Header{Name: "many/f" + body, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			tw.Write([]byte(body))
			tw.Close()
			l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, l)
		}
		img, err := mutate.AppendLayers(empty.Image, ls...)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://")+"/test/many:"+tag, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		return ref.String()
	}
	if _, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "many", Ref: push("120", 120), Insecure: true}, nil); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "many"})
	// The image has no shell: the agent's file API looks.
	if files, err := c.ListDir(ctx, sb.ID, "/many"); err != nil || len(files) != 120 {
		t.Errorf("a sandbox over 120 layers: %d files in /many, %v", len(files), err)
	}
	if r, err := c.ReadFile(ctx, sb.ID, "/many/f119"); err != nil {
		t.Error(err)
	} else if b, _ := io.ReadAll(r); string(b) != "119" {
		t.Errorf("the top layer's file: %q", b)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "toomany", Ref: push("501", 501), Insecure: true}, nil)
	if !errors.Is(err, atoll.ErrInvalid) || !strings.Contains(err.Error(), "at most 500") {
		t.Errorf("import of 501 layers: %v, want invalid naming the count", err)
	}
	if _, err := c.GetTemplate(ctx, "toomany"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("the refused template: %v", err)
	}
}

// TestTemplateImport imports an image from a registry (served in-process over
// the registry protocol) and from a docker archive, runs the image's own
// binary in sandboxes made from it, and deletes the template and its layers.
func TestTemplateImport(t *testing.T) {
	d, data, c := startRooted(t)
	ctx := context.Background()
	img := testImage(t)

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://")+"/test/hello:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	if out, code := d.cli("template", "import", ref.String(), "--name", "hello", "--insecure"); code != 0 {
		t.Fatalf("template import: %s", out)
	}
	// The import made its layers' images: the first sandbox starts as
	// quickly as the rest.
	if tmpl, err := c.GetTemplate(ctx, "hello"); err != nil {
		t.Fatal(err)
	} else {
		images := layerImages(data)
		for _, l := range tmpl.Layers {
			if !images[l] {
				t.Errorf("after the import, layer %s has no mounted image (images: %v)", l, images)
			}
		}
	}

	// A private registry: basic auth in front of the same registry.
	private := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "agent" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Scheme, r2.URL.Host = "http", strings.TrimPrefix(reg.URL, "http://")
		resp, err := http.DefaultTransport.RoundTrip(r2)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer private.Close()
	privRef := strings.TrimPrefix(private.URL, "http://") + "/test/hello:v1"
	if _, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "priv", Ref: privRef, Insecure: true}, nil); !errors.Is(err, atoll.ErrUnauthorized) {
		t.Errorf("import from a private registry without credentials: %v, want unauthorized", err)
	}
	if _, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "priv", Ref: privRef, Insecure: true, Username: "agent", Password: "s3cret"}, nil); err != nil {
		t.Errorf("import from a private registry with credentials: %v", err)
	} else if _, err := c.DeleteTemplate(ctx, "priv"); err != nil {
		t.Error(err)
	}
	archive := filepath.Join(testenv.Dir(t), "hello.tar")
	if err := tarball.WriteToFile(archive, ref, img); err != nil {
		t.Fatal(err)
	}
	if out, code := d.cli("template", "import", archive, "--name", "hello2"); code != 0 {
		t.Fatalf("template import of an archive: %s", out)
	}
	if out, _ := d.cli("template", "ls"); !strings.Contains(out, "hello2") || !strings.Contains(out, "host") {
		t.Errorf("template ls: %s", out)
	}

	for _, tmpl := range []string{"hello", "hello2"} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: tmpl})
		if err != nil {
			t.Fatalf("create from %s: %v", tmpl, err)
		}
		var out bytes.Buffer
		code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"hello", "/etc/gone.txt", "/data/old.txt", "/data/new.txt", "/home/user"}}, &out, &out)
		if err != nil || code != 0 {
			t.Fatalf("%s: exec hello: %v %d %s", tmpl, err, code, out.String())
		}
		want := "from-image /app 1234\n/etc/gone.txt false\n/data/old.txt false\n/data/new.txt true\n/home/user true\n"
		if out.String() != want {
			t.Errorf("%s: hello printed %q, want %q", tmpl, out.String(), want)
		}
		out.Reset()
		if code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"hello"}, User: "user", Cwd: "/"}, &out, &out); err != nil || code != 0 || out.String() != "from-image / 1000\n" {
			t.Errorf("%s: hello as user: %v %d %q", tmpl, err, code, out.String())
		}
		if _, err := c.WriteFile(ctx, sb.ID, "/app/state.txt", strings.NewReader("kept"), 0o644); err != nil {
			t.Errorf("%s: write: %v", tmpl, err)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	t1, err := c.GetTemplate(ctx, "hello")
	if err != nil {
		t.Fatal(err)
	}
	// A tag is a second name over the same layers; deleting one keeps the other.
	if out, code := d.cli("template", "tag", "hello", "hello-v1"); code != 0 || out != "hello-v1\n" {
		t.Fatalf("template tag: %q %d", out, code)
	}
	if tagged, err := c.GetTemplate(ctx, "hello-v1"); err != nil || strings.Join(tagged.Layers, ",") != strings.Join(t1.Layers, ",") {
		t.Errorf("tagged template: %+v %v", tagged, err)
	}
	if out, code := d.cli("template", "rm", "hello-v1"); code != 0 {
		t.Errorf("template rm of the tag: %s", out)
	}
	if _, err := c.GetTemplate(ctx, "hello"); err != nil {
		t.Errorf("template after deleting its tag: %v", err)
	}
	if len(t1.Layers) != 2 || t1.SharedLayers != 2 || t1.Workdir != "/app" || t1.User != "app" {
		t.Errorf("template: %+v", t1)
	}
	for _, tmpl := range []string{"hello", "hello2"} {
		if out, code := d.cli("template", "rm", tmpl); code != 0 {
			t.Errorf("template rm %s: %s", tmpl, out)
		}
	}
	// Both templates shared the same two layers; with both gone, so are they.
	for _, l := range t1.Layers {
		if _, err := os.Stat(filepath.Join(data, "layers", "layers", l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer %s still on disk: %v", l, err)
		}
	}
	if _, err := c.GetTemplate(ctx, "hello"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("get deleted template: %v", err)
	}
}

// TestTemplateBuild builds a template from a Dockerfile FROM the host
// template, runs a sandbox from it, rebuilds it from the cache, and refuses a
// COPY from outside the build context.
func TestTemplateBuild(t *testing.T) {
	d, _, c := startRooted(t)
	ctx := context.Background()
	dir := testenv.Dir(t)
	os.MkdirAll(filepath.Join(dir, "src", "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "src", "sub", "data.txt"), []byte("from the context\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(`FROM host
ARG GREETING=hello
ARG ONLYARG=from-arg
ENV GREETING=${GREETING} APP=/opt/app
RUN mkdir -p /opt/app && echo "built by $GREETING" > /opt/app/built.txt && echo "$GREETING $ONLYARG" > /root/args.txt && echo step-output
COPY src/ /opt/app/
ADD bundle.tar.gz /opt/unpacked/
WORKDIR $APP
RUN ["sh", "-c", "cat built.txt sub/data.txt > both.txt"]
CMD ["cat", "both.txt"]
LABEL atoll.start="echo app-starting && sleep 0.3 && echo up > /tmp/ready-flag" atoll.ready="test -f /tmp/ready-flag" atoll.pool=1
`), 0o644)

	{
		f, _ := os.Create(filepath.Join(dir, "bundle.tar.gz"))
		zw := gzip.NewWriter(f)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "inner/readme", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
		tw.Write([]byte("tar"))
		tw.Close()
		zw.Close()
		f.Close()
	}
	t0 := time.Now()
	out, code := d.cli("template", "build", "--name", "app", "--build-arg", "GREETING=hi", dir)
	if code != 0 {
		t.Fatalf("template build: %s\ndaemon: %s", out, d.out.String())
	}
	first := time.Since(t0)
	if !strings.Contains(out, "\nstep-output\n") {
		t.Errorf("build output lacks the RUN step's output: %s", out)
	}
	// Its size is its layers' files: built.txt, args.txt, data.txt,
	// readme and both.txt are 73 bytes (and the RUN steps may leave a
	// little more), none of the host template's.
	if tpl, err := c.GetTemplate(ctx, "app"); err != nil || tpl.Size < 73 || tpl.Size > 1<<20 {
		t.Errorf("the built template's size: %d bytes (%v), want its layers' 73 and a little", tpl.Size, err)
	}
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "app"})
	if out, code := sh(t, c, sb.ID, "pwd; echo $GREETING; cat both.txt /opt/unpacked/inner/readme"); code != 0 || out != "/opt/app\nhi\nbuilt by hi\nfrom the context\ntar" {
		t.Errorf("sandbox from the built template: %q (exit %d)", out, code)
	}
	// A RUN step sees the ARGs as its environment (ENV winning), and the
	// image keeps none of them that ENV did not set.
	if out, code := sh(t, c, sb.ID, "cat /root/args.txt; echo ${ONLYARG:-unset}"); code != 0 || out != "hi from-arg\nunset\n" {
		t.Errorf("ARGs in a RUN step: %q (exit %d)", out, code)
	}
	// Create waited for the ready command, which waited for the start command.
	if out, code := sh(t, c, sb.ID, "cat /tmp/ready-flag"); code != 0 || out != "up\n" {
		t.Errorf("start/ready commands: %q (exit %d)", out, code)
	}
	// What the start command printed is in the sandbox's log, tagged.
	if lines := readLogs(t, c, sb.ID, atoll.LogOptions{}); len(lines) == 0 || lines[0].Line != "app-starting" || lines[0].Tag != "start" {
		t.Errorf("the start command's log: %+v", lines)
	}
	if out, _ := sh(t, c, sb.ID, "python3 -c 'print(2)'"); out != "2\n" {
		t.Errorf("host tools in a template built FROM host: %q", out)
	}
	// Files of different layers, and one the sandbox writes, never share
	// an inode number (package lowers).
	if out, _ := sh(t, c, sb.ID, `echo mine > /opt/app/mine.txt && python3 -c '
import os
seen, n = set(), 0
for d, dirs, files in os.walk("/opt"):
    for f in dirs + files:
        st = os.lstat(os.path.join(d, f))
        seen.add((st.st_dev, st.st_ino))
        n += 1
print(n, len(seen))'`); out != "9 9\n" {
		t.Errorf("files and directories of four layers and the sandbox under /opt, and distinct inodes among them: %q, want 9 9", out)
	}

	// An unchanged rebuild takes every layer from the cache.
	t0 = time.Now()
	out, code = d.cli("template", "build", "--name", "app2", "--build-arg", "GREETING=hi", dir)
	if code != 0 {
		t.Fatalf("rebuild: %s", out)
	}
	again := time.Since(t0)
	if strings.Contains(out, "\nstep-output\n") || strings.Count(out, "(cached)") != 4 {
		t.Errorf("rebuild ran steps again: %s", out)
	}
	t.Logf("build %v, unchanged rebuild %v", first, again)
	a1, _ := c.GetTemplate(ctx, "app")
	a2, _ := c.GetTemplate(ctx, "app2")
	if a1.StartCmd == "" || a1.ReadyCmd != "test -f /tmp/ready-flag" {
		t.Errorf("template start/ready: %q / %q", a1.StartCmd, a1.ReadyCmd)
	}
	if strings.Join(a1.Layers, ",") != strings.Join(a2.Layers, ",") || len(a1.Layers) != 4 {
		t.Errorf("layers of the build and the rebuild: %v / %v", a1.Layers, a2.Layers)
	}

	// A changed file in the context rebuilds from that step on.
	os.WriteFile(filepath.Join(dir, "src", "sub", "data.txt"), []byte("changed\n"), 0o644)
	if out, code := d.cli("template", "build", "--name", "app3", "--build-arg", "GREETING=hi", dir); code != 0 {
		t.Fatalf("build after a change: %s", out)
	}
	a3, _ := c.GetTemplate(ctx, "app3")
	if len(a3.Layers) != 4 || a3.Layers[0] != a1.Layers[0] || a3.Layers[1] == a1.Layers[1] {
		t.Errorf("layers after changing a copied file: %v, before %v", a3.Layers, a1.Layers)
	}

	// COPY from outside the context is refused; a failing RUN fails the build.
	for name, df := range map[string]string{
		"escape": "FROM host\nCOPY ../../etc/passwd /x\n",
		"fails":  "FROM host\nRUN exit 3\n",
	} {
		bad := testenv.Dir(t)
		os.WriteFile(filepath.Join(bad, "Dockerfile"), []byte(df), 0o644)
		if out, code := d.cli("template", "build", "--name", "bad-"+name, bad); code == 0 {
			t.Errorf("%s: build succeeded: %s", name, out)
		}
		if _, err := c.GetTemplate(ctx, "bad-"+name); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("%s: failed build left a template: %v", name, err)
		}
	}
	c.DeleteSandbox(ctx, sb.ID)

	// atoll.pool=1 keeps one sandbox of it started, past its ready command:
	// a create is then handed that one, and does not wait the 0.3 s that
	// the start command takes.
	var warm time.Duration
	for i := 0; i < 50; i++ {
		time.Sleep(200 * time.Millisecond)
		t0 := time.Now()
		sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "app", Labels: map[string]string{"warm": "yes"}})
		warm = time.Since(t0)
		if out, code := sh(t, c, sb.ID, "cat /tmp/ready-flag"); code != 0 || out != "up\n" {
			t.Errorf("warm sandbox: %q", out)
		}
		c.DeleteSandbox(ctx, sb.ID)
		if warm < 300*time.Millisecond {
			break
		}
	}
	if warm >= 300*time.Millisecond {
		t.Errorf("create from a pooled template took %v, as long as a cold start with its start command", warm)
	}
	// Deleting the template discards its pooled sandboxes first.
	for _, name := range []string{"app", "app2", "app3"} {
		if _, err := c.DeleteTemplate(ctx, name); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	}
}

// TestTemplateBootstrap makes a Debian template with debootstrap from Debian's
// mirror and runs Debian's own tools in a sandbox made from it.
func TestTemplateBootstrap(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "debootstrap")
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data)
	c := d.client()
	ctx := context.Background()
	out, code := d.cli("template", "bootstrap", "debian", "--name", "debian")
	if code != 0 {
		t.Fatalf("template bootstrap: %s", out)
	}
	if !strings.Contains(out, "Base system installed successfully") {
		t.Errorf("bootstrap log not streamed: %s", out)
	}
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "debian"})
	got, code := sh(t, c, sb.ID, "cut -d. -f1 /etc/debian_version; apt-get --version | head -1 | cut -d' ' -f1; test -e /var/lib/dpkg/status && echo dpkg")
	if code != 0 || got != "12\napt\ndpkg\n" {
		t.Errorf("debian sandbox: %q (exit %d)", got, code)
	}
	var uid bytes.Buffer
	if code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"id", "-u"}, User: "user"}, &uid, &uid); err != nil || code != 0 || uid.String() != "1000\n" {
		t.Errorf("user in the debian sandbox: %q %v", uid.String(), err)
	}
	c.DeleteSandbox(ctx, sb.ID)
}
