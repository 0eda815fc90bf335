package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterTemplates builds a template on node 1 of a three-node cluster
// and runs sandboxes of it on node 2, which pulls its layers from the
// object store once (the create's answer and node 2's log say so, and for
// how long); the nodes that hold the layers report them, and the scheduler
// then prefers them; a layer whose object was tampered with is refused;
// deleting the template deletes its layers' objects and the nodes' copies.
func TestClusterTemplates(t *testing.T) {
	// Room for a build's scratch sandbox (64 GiB of disk, 4 GiB of memory).
	cl := startCluster(t, netcluster.Config{Cluster: true,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--node-capacity", "cpu=4,memory=8Gi,disk=100,sandboxes=8"}})
	ctx := context.Background()
	c1, c3 := cl.Nodes[0].Client(), cl.Nodes[2].Client()
	bucket, err := blob.Open(ctx, os.Getenv("ATOLL_TEST_S3_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	objects := func() []string {
		keys, err := bucket.List(ctx, "layers/sha256/")
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}

	// A template built on node 1: its layer is published.
	before := objects()
	tpl := buildOn(t, c1, "shared", "FROM host\nRUN mkdir -p /opt/t && echo made-on-n1 > /opt/t/file && head -c 16777216 /dev/urandom > /opt/t/blob\n")
	published := newKeys(before, objects())
	if len(published) != 1 || len(tpl.Layers) != 1 {
		t.Fatalf("published %v for layers %v", published, tpl.Layers)
	}

	// Only node 2 takes sandboxes: the first create there pulls the layer.
	for _, n := range []string{"n1", "n3"} {
		if err := c1.CordonNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// Three creates at once, each through another node: one download.
	small := api.CreateSandboxRequest{Template: "shared", CPU: 0.25, MemoryMiB: 64}
	t0 := time.Now()
	first, err := atOnce(3, func(i int) (api.Sandbox, error) { return cl.Nodes[i].Client().CreateSandbox(ctx, small) })
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("creates placed on node 2: %v\nnode 2: %s", err, tail(cl.Nodes[1].Log()))
	}
	for _, sb := range first {
		if sb.Node != "n2" || sb.TemplatePull == nil || sb.TemplatePull.Layers != 1 || sb.TemplatePull.Bytes < 16<<20 || sb.TemplatePull.MS <= 0 {
			t.Fatalf("first creates on node 2: node %q, template_pull %+v", sb.Node, sb.TemplatePull)
		}
		if out, code := sh(t, c1, sb.ID, "cat /opt/t/file; stat -c %s /opt/t/blob"); out != "made-on-n1\n16777216\n" || code != 0 {
			t.Errorf("the template's files on node 2: %q exit %d", out, code)
		}
	}
	sb1 := first[0]
	t.Logf("3 concurrent first creates on node 2 in %s; pulling %d layer of %d bytes took %.1f ms in the first answer", took.Round(time.Millisecond),
		sb1.TemplatePull.Layers, sb1.TemplatePull.Bytes, sb1.TemplatePull.MS)
	if got := strings.Count(cl.Nodes[1].Log(), "template layer fetched"); got != 1 {
		t.Errorf("node 2 fetched the layer %d times, want once", got)
	}
	if !strings.Contains(cl.Nodes[1].Log(), "pulled template layers") {
		t.Errorf("node 2's log does not say it pulled the layers")
	}
	t0 = time.Now()
	sb2, err := c3.CreateSandbox(ctx, small)
	if err != nil {
		t.Fatal(err)
	}
	if sb2.Node != "n2" || sb2.TemplatePull != nil {
		t.Errorf("second create on node 2: node %q, template_pull %+v; want no pull", sb2.Node, sb2.TemplatePull)
	}
	t.Logf("second create on node 2 in %s", time.Since(t0).Round(time.Millisecond))
	if got := strings.Count(cl.Nodes[1].Log(), "template layer fetched"); got != 1 {
		t.Errorf("node 2 fetched the layer %d times", got)
	}

	// The heartbeats report who holds the version: nodes 1 and 2.
	waitFor(t, 20*time.Second, "nodes 1 and 2 to report the template's version", func() bool {
		ns, err := c1.ListNodes(ctx)
		if err != nil {
			return false
		}
		held := map[string]bool{}
		for _, n := range ns {
			held[n.Name] = slices.Contains(n.Templates, tpl.VersionID)
		}
		return held["n1"] && held["n2"] && !held["n3"]
	})

	// An image imported on node 1 (layers with whiteouts under atoll's
	// top layer) runs on node 2 as it would on node 1.
	archive := filepath.Join(testenv.Dir(t), "hello.tar")
	ref, _ := name.ParseReference("test/hello:v1")
	if err := tarball.WriteToFile(archive, ref, testImage(t)); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	imported, err := c1.ImportTemplateArchive(ctx, "imported", f, nil)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	sbi := newSandbox(ctx, t, c1, api.CreateSandboxRequest{Template: "imported", CPU: 0.25, MemoryMiB: 64})
	if sbi.Node != "n2" || sbi.TemplatePull == nil || sbi.TemplatePull.Layers != len(imported.Layers) {
		t.Errorf("create of the imported template: node %q, template_pull %+v, want its %d layers", sbi.Node, sbi.TemplatePull, len(imported.Layers))
	}
	var out bytes.Buffer
	code, err := c1.Exec(ctx, sbi.ID, api.ExecRequest{Cmd: []string{"hello", "/etc/gone.txt", "/data/old.txt", "/data/new.txt", "/home/user"}}, &out, &out)
	if want := "from-image /app 1234\n/etc/gone.txt false\n/data/old.txt false\n/data/new.txt true\n/home/user true\n"; err != nil || code != 0 || out.String() != want {
		t.Errorf("the imported template on node 2: %v exit %d: %q, want %q", err, code, out.String(), want)
	}
	if err := c1.DeleteSandbox(ctx, sbi.ID); err != nil {
		t.Fatal(err)
	}

	// Hostile: the object of another template's layer is replaced; node 2
	// refuses it and holds nothing of it.
	before = objects()
	bad := buildOn(t, c1, "tampered", "FROM host\nRUN echo tampered-template > /opt-file\n")
	keys := newKeys(before, objects())
	if len(keys) != 1 {
		t.Fatalf("published %v", keys)
	}
	if err := bucket.Put(ctx, keys[0], func(w io.Writer) error {
		_, err := w.Write([]byte("not the layer that was published"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = c1.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "tampered", CPU: 0.25, MemoryMiB: 64})
	var apiErr *atoll.Error
	if !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "digest") {
		t.Errorf("create of a template whose layer was tampered with: %v; want refused for its digest", err)
	} else {
		t.Logf("tampered layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cl.Nodes[1].Data, "layers", "layers", bad.Layers[0])); err == nil {
		t.Errorf("node 2 holds the tampered layer")
	}

	// With every node open again, creates go where the layers are.
	for _, n := range []string{"n1", "n3"} {
		if err := c1.UncordonNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{first[0].ID, first[1].ID, first[2].ID, sb2.ID} {
		if err := c1.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	var placed []string
	for range 4 {
		sb, err := c3.CreateSandbox(ctx, small)
		if err != nil {
			t.Fatal(err)
		}
		placed = append(placed, sb.Node)
		if sb.Node == "n3" {
			t.Errorf("sandbox %s placed on n3, which lacks the template's layers (n1, n2 hold them)", sb.ID)
		}
		if err := c3.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("placed with every node open: %v", placed)

	// A build on node 3 FROM the template pulls its layer there first.
	buildOn(t, c3, "derived", "FROM shared\nRUN cp /opt/t/file /opt/t/copy\n")
	if got := strings.Count(cl.Nodes[2].Log(), "template layer fetched"); got != 1 {
		t.Errorf("node 3 fetched %d layers for a build FROM the template, want 1", got)
	}
	sbd := newSandbox(ctx, t, c3, api.CreateSandboxRequest{Template: "derived", CPU: 0.25, MemoryMiB: 64})
	if out, code := sh(t, c3, sbd.ID, "cat /opt/t/copy"); out != "made-on-n1\n" || code != 0 {
		t.Errorf("the derived template on node %s: %q exit %d", sbd.Node, out, code)
	}
	if err := c3.DeleteSandbox(ctx, sbd.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.DeleteTemplate(ctx, "derived"); err != nil {
		t.Fatal(err)
	}

	// Deleting the template deletes its object, and each node drops its copy.
	for _, n := range cl.Nodes {
		if _, err := os.Stat(filepath.Join(n.Data, "layers", "layers", tpl.Layers[0])); err != nil {
			t.Fatalf("node %d's copy of the layer: %v", n.Index, err)
		}
	}
	if _, err := c1.DeleteTemplate(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(objects(), published[0]) {
		t.Errorf("object %s outlived its template", published[0])
	}
	waitFor(t, 20*time.Second, "every node to drop the layer", func() bool {
		for _, n := range cl.Nodes {
			if _, err := os.Stat(filepath.Join(n.Data, "layers", "layers", tpl.Layers[0])); err == nil {
				return false
			}
		}
		return true
	})
}

// buildOn builds template name from dockerfile through c.
func buildOn(t *testing.T, c *atoll.Client, name, dockerfile string) api.Template {
	t.Helper()
	tpl, err := c.BuildTemplate(context.Background(), name, atoll.BuildOptions{}, testenv.Tar("Dockerfile", dockerfile), nil)
	if err != nil {
		t.Fatalf("building %s: %v", name, err)
	}
	return tpl
}

// newKeys are the keys of after that before lacks.
func newKeys(before, after []string) []string {
	var out []string
	for _, k := range after {
		if !slices.Contains(before, k) {
			out = append(out, k)
		}
	}
	return out
}

func tail(s string) string { return s[max(0, len(s)-4096):] }
