package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// versionedApp writes a build context whose Dockerfile makes two layers over
// the host template: one the same in every version (shared.txt), one with
// version's text in /opt/version.txt; extra Dockerfile lines follow.
func versionedApp(t *testing.T, dir, version string, extra ...string) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	df := "FROM host\nCOPY shared.txt /opt/shared.txt\nCOPY version.txt /opt/version.txt\n" + strings.Join(extra, "\n") + "\n"
	for name, body := range map[string]string{"Dockerfile": df, "shared.txt": "the same in every version\n", "version.txt": version + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// layerDirs lists the layers on disk of the server on data.
func layerDirs(data string) []string {
	ents, _ := os.ReadDir(filepath.Join(data, "layers", "layers"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// pooledVersions are the template versions of the pooled sandboxes recorded
// in the store of the server on data.
func pooledVersions(t *testing.T, data string) []string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(data, "atoll.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT template_version FROM sandboxes WHERE state = 'pooled' AND template_version != '' ORDER BY template_version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		rows.Scan(&v)
		out = append(out, v)
	}
	return out
}

// TestTemplateVersions rebuilds a template while a sandbox runs from it: the
// name moves to the new version, which new sandboxes get, while the old
// sandbox keeps its version through stop/start, a server restart, an
// archive and restore, and forks; NAME@VERSION creates from the old version
// while it exists; the warm pool moves to the new version; the old version,
// and its layers no other version shares, go with its last sandbox and
// snapshot; a removed name's versions stay while in use. Hostile version
// references and another tenant's hold on a version answer 4xx.
func TestTemplateVersions(t *testing.T) {
	d, data, c := startRooted(t, "--warm-pool", "0")
	ctx := context.Background()
	dir := testenv.Dir(t)
	versionOf := func(id string) string {
		t.Helper()
		out, code := sh(t, c, id, "cat /opt/version.txt /opt/shared.txt")
		if code != 0 {
			t.Errorf("sandbox %s: %q (exit %d)", id, out, code)
		}
		v, _, _ := strings.Cut(out, "\n")
		return v
	}

	versionedApp(t, dir, "one", "LABEL atoll.pool=1")
	if out, code := d.cli("template", "build", "--name", "app", dir); code != 0 {
		t.Fatalf("build: %s\n%s", out, d.out.String())
	}
	first, err := c.GetTemplate(ctx, "app")
	if err != nil || first.Version != 1 || len(first.VersionID) != 20 || len(first.Layers) != 2 || len(first.Versions) != 1 {
		t.Fatalf("first version: %+v, %v", first, err)
	}
	old := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "app"})
	if old.TemplateVersion != first.VersionID || versionOf(old.ID) != "one" {
		t.Errorf("sandbox of the first version: %+v", old)
	}
	sh(t, c, old.ID, "echo mine > /root/state")
	snap, err := c.CreateSnapshot(ctx, old.ID, api.CreateSnapshotRequest{Name: "of-one"})
	if err != nil || snap.TemplateVersion != first.VersionID {
		t.Fatalf("snapshot: %+v, %v", snap, err)
	}

	// Rebuild while it runs: no conflict; the name moves on.
	versionedApp(t, dir, "two", "LABEL atoll.pool=1")
	if out, code := d.cli("template", "build", "--name", "app", dir); code != 0 {
		t.Fatalf("rebuild while a sandbox runs: %s", out)
	}
	second, err := c.GetTemplate(ctx, "app")
	if err != nil || second.Version != 2 || second.VersionID == first.VersionID || second.OldVersions != 1 || second.Layers[0] != first.Layers[0] || second.Layers[1] == first.Layers[1] {
		t.Fatalf("second version: %+v, %v (first %+v)", second, err, first)
	}
	if v := versionOf(old.ID); v != "one" {
		t.Errorf("the running sandbox after the rebuild: %q", v)
	}
	fresh, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app"})
	if err != nil || fresh.TemplateVersion != second.VersionID || versionOf(fresh.ID) != "two" {
		t.Errorf("a new sandbox after the rebuild: %+v, %v", fresh, err)
	}
	var pinned []string
	for _, ref := range []string{"app@1", "app@" + first.VersionID} {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: ref})
		if err != nil {
			t.Fatalf("create %s: %v", ref, err)
		}
		pinned = append(pinned, sb.ID)
		if sb.Template != "app" || sb.TemplateVersion != first.VersionID || versionOf(sb.ID) != "one" {
			t.Errorf("create %s: %+v", ref, sb)
		}
	}
	if sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app@2"}); err != nil || versionOf(sb.ID) != "two" {
		t.Errorf("create app@2: %+v, %v", sb, err)
	} else {
		c.DeleteSandbox(ctx, sb.ID)
	}
	// Over the E2B API, a tag names a version as @ does.
	for tag, want := range map[string]string{"app:1": "one", "app:" + first.VersionID: "one", "app:default": "two", "app": "two"} {
		a := d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: d.key, body: `{"templateID":"` + tag + `"}`})
		a.want(t, "E2B create of "+tag, 201)
		var sb struct{ SandboxID, TemplateID string }
		json.Unmarshal(a.body, &sb)
		if v := versionOf(sb.SandboxID); v != want || sb.TemplateID != "app" {
			t.Errorf("E2B create of %s: version %q, templateID %q; want %s", tag, v, sb.TemplateID, want)
		}
		c.DeleteSandbox(ctx, sb.SandboxID)
	}
	d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: d.key, body: `{"templateID":"app:999"}`}).want(t, "E2B create of app:999", 404)
	d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: d.key, body: `{"templateID":"base:1"}`}).want(t, "E2B create of base:1", 404)
	d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: d.key, body: `{"templateID":"app:x/y"}`}).want(t, "E2B create of app:x/y", 400)
	// A fork after the rebuild: children of the old version.
	kids, err := c.ForkSandbox(ctx, old.ID, api.ForkRequest{Count: 1})
	if err != nil || len(kids) != 1 || kids[0].TemplateVersion != first.VersionID || versionOf(kids[0].ID) != "one" {
		t.Fatalf("fork after the rebuild: %+v, %v", kids, err)
	}
	if out, _ := sh(t, c, kids[0].ID, "cat /root/state"); out != "mine\n" {
		t.Errorf("the child's files: %q", out)
	}
	// A sandbox from the snapshot has the snapshot's version.
	fromSnap, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: snap.ID})
	if err != nil || fromSnap.TemplateVersion != first.VersionID || versionOf(fromSnap.ID) != "one" {
		t.Errorf("create from a snapshot of the first version: %+v, %v", fromSnap, err)
	}
	// A snapshot of one version is not restored over another.
	if _, err := c.RestoreSandbox(ctx, fresh.ID, api.RestoreRequest{Snapshot: snap.ID}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("restoring a snapshot of version 1 into a sandbox of version 2: %v, want invalid", err)
	}

	// The old sandbox restarted, across a server restart, archived and
	// restored: still the old version, with its files.
	restart := func(how string) {
		t.Helper()
		if _, err := c.StopSandbox(ctx, old.ID); err != nil {
			t.Fatalf("%s: stop: %v", how, err)
		}
		if how == "archive" {
			if sb, err := c.ArchiveSandbox(ctx, old.ID); err != nil || sb.State != api.StateArchived {
				t.Fatalf("archive: %+v, %v", sb, err)
			}
		}
		sb, err := c.StartSandbox(ctx, old.ID)
		if err != nil || sb.TemplateVersion != first.VersionID {
			t.Fatalf("%s: start: %+v, %v", how, sb, err)
		}
		if v := versionOf(old.ID); v != "one" {
			t.Errorf("%s: version %q", how, v)
		}
		if out, _ := sh(t, c, old.ID, "cat /root/state"); out != "mine\n" {
			t.Errorf("%s: files %q", how, out)
		}
	}
	restart("stop/start")
	d.stop()
	d.start()
	c = d.client()
	if v := versionOf(old.ID); v != "one" {
		t.Errorf("re-adopted after a server restart: %q", v)
	}
	restart("stop/start after a server restart")
	restart("archive")

	// The pool (LABEL atoll.pool=1): its sandboxes were of the first
	// version; now only of the second, then of the third.
	deadline := time.Now().Add(30 * time.Second)
	for got := pooledVersions(t, data); !slices.Equal(got, []string{second.VersionID}); got = pooledVersions(t, data) {
		if time.Now().After(deadline) {
			t.Fatalf("pooled sandboxes of versions %v, want one of %s", got, second.VersionID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	versionedApp(t, dir, "three", "LABEL atoll.pool=1")
	if out, code := d.cli("template", "build", "--name", "app", dir); code != 0 {
		t.Fatalf("third build: %s", out)
	}
	third, _ := c.GetTemplate(ctx, "app")
	for got := pooledVersions(t, data); !slices.Equal(got, []string{third.VersionID}); got = pooledVersions(t, data) {
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("pooled sandboxes after a rebuild: versions %v, want one of %s", got, third.VersionID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app"}); err != nil || sb.TemplateVersion != third.VersionID || versionOf(sb.ID) != "three" {
		t.Errorf("create after the third build: %+v, %v", sb, err)
	} else {
		c.DeleteSandbox(ctx, sb.ID)
	}
	// Version 2 was held only by fresh; version 1 by five sandboxes and the
	// snapshot.
	got, err := c.GetTemplate(ctx, "app")
	if err != nil || got.Version != 3 || got.OldVersions != 2 || len(got.Versions) != 3 {
		t.Fatalf("after three builds: %+v, %v", got, err)
	}
	uses := map[int][2]int{}
	for _, v := range got.Versions {
		uses[v.Number] = [2]int{v.Sandboxes, v.Snapshots}
	}
	if uses[1] != [2]int{5, 1} || uses[2] != [2]int{1, 0} || uses[3] != [2]int{0, 0} {
		t.Errorf("what uses each version: %v", uses)
	}
	if out, _ := d.cli("template", "ls"); !strings.Contains(out, "VERSION") || !strings.Contains(strings.Join(strings.Fields(out), " "), "app 3 2 build") {
		t.Errorf("template ls: %s", out)
	}
	if out, _ := d.cli("template", "inspect", "app"); !strings.Contains(out, first.VersionID) || !strings.Contains(out, " 3 ("+third.VersionID+")") {
		t.Errorf("template inspect: %s", out)
	}

	// Hostile references to versions.
	other, err := c.CreateKey(ctx, api.CreateKeyRequest{Name: "other", Tenant: "other"})
	if err != nil {
		t.Fatal(err)
	}
	oc := d.clientWith(other.Key)
	for _, tc := range []struct {
		c    *atoll.Client
		ref  string
		want error
	}{
		{c, "app@999", atoll.ErrNotFound},
		{c, "app@0", atoll.ErrInvalid},
		{c, "app@-1", atoll.ErrInvalid},
		{c, "app@", atoll.ErrInvalid},
		{c, "app@1@1", atoll.ErrInvalid},
		{c, "app@abc", atoll.ErrInvalid},
		{c, "app@99999999999999999999999", atoll.ErrInvalid},
		{c, "app@v0000000000000000000", atoll.ErrNotFound},
		{c, "nope@1", atoll.ErrNotFound},
		{c, "host@1", atoll.ErrInvalid},
		{c, "../app@1", atoll.ErrInvalid},
		{c, "app@" + strings.Repeat("9", 4096), atoll.ErrInvalid},
		// Version 1 is held by the admin tenant's sandboxes only: not
		// another tenant's to see or to pin.
		{oc, "app@1", atoll.ErrNotFound},
		{oc, "app@" + first.VersionID, atoll.ErrNotFound},
	} {
		if sb, err := tc.c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: tc.ref}); !errors.Is(err, tc.want) {
			t.Errorf("create %q: %+v, %v; want %v", tc.ref, sb, err, tc.want)
		}
	}
	if sb, err := oc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app@3"}); err != nil || sb.TemplateVersion != third.VersionID {
		t.Errorf("another tenant's create of the current version by number: %+v, %v", sb, err)
	} else {
		oc.DeleteSandbox(ctx, sb.ID)
	}
	if tmpl, err := oc.GetTemplate(ctx, "app"); err != nil || len(tmpl.Versions) != 1 || tmpl.Versions[0].ID != third.VersionID {
		t.Errorf("another tenant sees versions %+v, %v; want only the current one", tmpl.Versions, err)
	}
	if ts, err := oc.ListTemplates(ctx); err != nil || !slices.ContainsFunc(ts, func(t api.Template) bool { return t.Name == "app" && t.OldVersions == 0 }) {
		t.Errorf("another tenant's list: %+v, %v; want app with no old versions of its own", ts, err)
	}

	// A tag may keep an older version by a name of its own.
	if out, code := d.cli("template", "tag", "app@1", "keep"); code != 0 || out != "keep\n" {
		t.Fatalf("template tag app@1 keep: %d %q", code, out)
	}
	if kept, err := c.GetTemplate(ctx, "keep"); err != nil || kept.VersionID != first.VersionID {
		t.Errorf("the tag of version 1: %+v, %v", kept, err)
	}
	if sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "keep"}); err != nil || sb.TemplateVersion != first.VersionID {
		t.Errorf("create from the tag: %+v, %v", sb, err)
	} else {
		c.DeleteSandbox(ctx, sb.ID)
	}
	if _, err := c.DeleteTemplate(ctx, "keep"); err != nil {
		t.Fatal(err)
	}

	// Collection: version 1 goes with the last of its sandboxes and its
	// snapshot, and so does its own layer; the layer it shares stays.
	for _, id := range append([]string{old.ID, kids[0].ID, fromSnap.ID}, pinned...) {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := c.GetTemplate(ctx, "app"); len(got.Versions) != 3 {
		t.Errorf("version 1 went while its snapshot holds it: %+v", got.Versions)
	}
	if _, err := os.Stat(filepath.Join(data, "layers", "layers", first.Layers[1])); err != nil {
		t.Errorf("the layer of a held version: %v", err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	got, _ = c.GetTemplate(ctx, "app")
	if len(got.Versions) != 2 || got.OldVersions != 1 || slices.ContainsFunc(got.Versions, func(v api.TemplateVersion) bool { return v.ID == first.VersionID }) {
		t.Errorf("after the last user of version 1 went: %+v", got.Versions)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app@1"}); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("create from a collected version: %v", err)
	}
	layers := layerDirs(data)
	if slices.Contains(layers, first.Layers[1]) || !slices.Contains(layers, first.Layers[0]) {
		t.Errorf("layers after version 1 went: %v; want without %s, with the shared %s", layers, first.Layers[1], first.Layers[0])
	}

	// Removing the name: versions in use stay, and rm says so.
	out, code := d.cli("template", "rm", "app")
	if code != 0 || !strings.Contains(out, "version 2 ("+second.VersionID+") stays until unused: used by 1 sandbox") {
		t.Errorf("template rm of a name in use: %d %q", code, out)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "app"}); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("create from a removed name: %v", err)
	}
	if got, err := c.GetTemplate(ctx, "app"); err != nil || !got.Removed || len(got.Versions) != 1 {
		t.Errorf("a removed name whose version is in use: %+v, %v", got, err)
	}
	if _, err := c.StopSandbox(ctx, fresh.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartSandbox(ctx, fresh.ID); err != nil || versionOf(fresh.ID) != "two" {
		t.Errorf("restart of a sandbox whose name was removed: %v", err)
	}
	if err := c.DeleteSandbox(ctx, fresh.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetTemplate(ctx, "app"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("the removed name after its last sandbox: %v", err)
	}
	if l := layerDirs(data); len(l) != 0 {
		t.Errorf("layers left after every version went: %v", l)
	}
}

// TestKillDuringTemplateRebuild kills the server while a rebuild of a
// template that a sandbox uses runs a step: after the restart the name
// still points to the old version, no new version is half made, the
// sandbox runs on, and the layers, sandboxes and mounts of the rebuild are
// gone; a rebuild then succeeds.
func TestKillDuringTemplateRebuild(t *testing.T) {
	d, data, c := startRooted(t, "--warm-pool", "0")
	ctx := context.Background()
	dir := testenv.Dir(t)
	versionedApp(t, dir, "one")
	if out, code := d.cli("template", "build", "--name", "app", dir); code != 0 {
		t.Fatalf("build: %s", out)
	}
	first, _ := c.GetTemplate(ctx, "app")
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "app"})
	before := hostState(t, data)
	layersBefore := layerDirs(data)

	versionedApp(t, dir, "two", "RUN echo started && sleep 60")
	build := exec.Command(d.bin, "template", "build", "--name", "app", dir)
	build.Env = append(os.Environ(), "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key)
	stderr, _ := build.StderrPipe() // where build logs go
	if err := build.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && sc.Text() != "started" {
	}
	// The RUN step's sandbox runs; the COPY steps' layers are committed.
	if l := layerDirs(data); len(l) <= len(layersBefore) {
		t.Errorf("layers during the rebuild: %v", l)
	}
	d.kill()
	build.Wait()

	d.start()
	c = d.client()
	got, err := c.GetTemplate(ctx, "app")
	if err != nil || got.VersionID != first.VersionID || got.Version != 1 || len(got.Versions) != 1 {
		t.Errorf("after a kill during the rebuild: %+v, %v", got, err)
	}
	if out, code := sh(t, c, sb.ID, "cat /opt/version.txt"); code != 0 || out != "one\n" {
		t.Errorf("the sandbox after the kill: %q (exit %d)", out, code)
	}
	if l := layerDirs(data); !slices.Equal(l, layersBefore) {
		t.Errorf("layers after the restart: %v, want those of version 1: %v", l, layersBefore)
	}
	if tops, _ := filepath.Glob(filepath.Join(data, "layers", "templates", "image-*")); len(tops) != 0 {
		t.Errorf("template layers left: %v", tops)
	}
	if l := leftSince(t, before, data); len(l) > 0 {
		t.Errorf("left on the host by the rebuild the kill cut short: %v", l)
	}
	versionedApp(t, dir, "two", "RUN echo started")
	if out, code := d.cli("template", "build", "--name", "app", dir); code != 0 {
		t.Fatalf("rebuild after the restart: %s", out)
	}
	if got, err := c.GetTemplate(ctx, "app"); err != nil || got.Version != 2 || got.OldVersions != 1 {
		t.Errorf("the rebuild after the restart: %+v, %v", got, err)
	}
	if out, _ := sh(t, c, sb.ID, "cat /opt/version.txt"); out != "one\n" {
		t.Errorf("the old sandbox after the rebuild: %q", out)
	}
}

// tinyImage is an image of one layer holding /v.txt with text, and no shell.
func tinyImage(t *testing.T, text string) v1.Image {
	t.Helper()
	buf := testenv.Tar("v.txt", text)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestTemplateReimport imports an image under a name a sandbox uses: the
// name moves to the new image while the sandbox keeps the old one, across a
// stop and start; when the sandbox goes, so do the old image's layer and
// the template's top layer over it.
func TestTemplateReimport(t *testing.T) {
	d, data, c := startRooted(t, "--warm-pool", "0")
	ctx := context.Background()
	read := func(id string) string {
		t.Helper()
		r, err := c.ReadFile(ctx, id, "/v.txt")
		if err != nil {
			t.Fatalf("read in %s: %v", id, err)
		}
		b, _ := io.ReadAll(r)
		return string(b)
	}
	ref, _ := name.ParseReference("example.test/tiny:1")
	imp := func(text string) api.Template {
		t.Helper()
		archive := filepath.Join(testenv.Dir(t), "tiny.tar")
		if err := tarball.WriteToFile(archive, ref, tinyImage(t, text)); err != nil {
			t.Fatal(err)
		}
		if out, code := d.cli("template", "import", archive, "--name", "tiny"); code != 0 {
			t.Fatalf("import: %s", out)
		}
		tmpl, err := c.GetTemplate(ctx, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		return tmpl
	}
	tops := func() []string {
		m, _ := filepath.Glob(filepath.Join(data, "layers", "templates", "image-tiny-*"))
		return m
	}
	first := imp("one")
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Template: "tiny"})
	second := imp("two")
	if second.Version != 2 || second.OldVersions != 1 || second.Layers[0] == first.Layers[0] {
		t.Fatalf("reimport while a sandbox runs: %+v", second)
	}
	if len(tops()) != 2 || !slices.Equal(layerDirs(data), slices.Sorted(slices.Values([]string{first.Layers[0], second.Layers[0]}))) {
		t.Errorf("while both versions are held: top layers %v, layers %v", tops(), layerDirs(data))
	}
	if v := read(sb.ID); v != "one" {
		t.Errorf("the old sandbox reads %q", v)
	}
	c.StopSandbox(ctx, sb.ID)
	if _, err := c.StartSandbox(ctx, sb.ID); err != nil || read(sb.ID) != "one" {
		t.Errorf("the old sandbox restarted: %v", err)
	}
	nsb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "tiny"})
	if err != nil || read(nsb.ID) != "two" {
		t.Fatalf("a new sandbox: %v", err)
	}
	// The same image again is the same version: nothing moves.
	if again := imp("two"); again.VersionID != second.VersionID || again.Version != 2 {
		t.Errorf("the same image again: %+v", again)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := layerDirs(data); !slices.Equal(got, []string{second.Layers[0]}) {
		t.Errorf("layers after the old version's last sandbox went: %v, want only %s", got, second.Layers[0])
	}
	if len(tops()) != 1 {
		t.Errorf("top layers after the old version went: %v", tops())
	}
	c.DeleteSandbox(ctx, nsb.ID)
	if _, err := c.DeleteTemplate(ctx, "tiny"); err != nil {
		t.Fatal(err)
	}
	if len(tops()) != 0 || len(layerDirs(data)) != 0 {
		t.Errorf("after the name and its sandboxes went: top layers %v, layers %v", tops(), layerDirs(data))
	}
}
