package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestArchive moves a stopped sandbox's files to the archive store, frees the
// local disk, and brings them back on start, whiteouts and all: with the
// default file:// store and with an S3 server.
func TestArchive(t *testing.T) {
	t.Run("file", func(t *testing.T) { testArchive(t, "") })
	t.Run("s3", func(t *testing.T) { testArchive(t, testenv.S3URL(t)) })
}

// testArchive runs TestArchive with the store at url, "" for the default.
func testArchive(t *testing.T, url string) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	var args []string
	if url != "" {
		args = []string{"--archive", url}
	} else {
		url = "file://" + filepath.Join(data, "archive")
	}
	d := startDaemon(t, data, args...)
	c := d.client()
	ctx := context.Background()
	bucket, err := blob.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	object := "sandboxes/" + sb.ID + ".tar"
	gone := func(when string) {
		t.Helper()
		if r, err := bucket.Get(ctx, object); !errors.Is(err, errdefs.ErrNotFound) {
			if err == nil {
				r.Close()
			}
			t.Errorf("archive object %s: %v, want NotFound", when, err)
		}
	}
	sum, _ := sh(t, c, sb.ID, "dd if=/dev/urandom of=/root/data bs=1M count=64 2>/dev/null; rm /etc/hostname; rm -rf /var/log && mkdir /var/log && touch /var/log/new; md5sum /root/data")
	if _, err := c.ArchiveSandbox(ctx, sb.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("archive of a running sandbox: %v, want conflict", err)
	}
	if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := c.ArchiveSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateArchived {
		t.Fatalf("archive: %+v %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(data, "layers", "sandboxes", sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("local writable layer still there: %v", err)
	}
	if r, err := bucket.Get(ctx, object); err != nil || r.Size() < 64<<20 {
		t.Errorf("archive object: %v", err)
	} else {
		r.Close()
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("exec on an archived sandbox: %v", err)
	}
	// While the files come back, the sandbox shows how far they have got.
	started := make(chan error, 1)
	go func() { _, err := c.StartSandbox(ctx, sb.ID); started <- err }()
	var seen *api.Progress
poll:
	for {
		select {
		case err := <-started:
			if err != nil {
				t.Fatal(err)
			}
			break poll
		default:
		}
		if got, err := c.GetSandbox(ctx, sb.ID); err == nil && got.Progress != nil && seen == nil {
			seen = got.Progress
		}
		time.Sleep(5 * time.Millisecond)
	}
	if seen == nil || seen.Op != "restoring" || seen.TotalBytes < 64<<20 || seen.DoneBytes > seen.TotalBytes {
		t.Errorf("progress during the restore: %+v", seen)
	}
	if got, _ := c.GetSandbox(ctx, sb.ID); got.Progress != nil {
		t.Errorf("progress after the restore: %+v", got.Progress)
	}
	out, _ := sh(t, c, sb.ID, "md5sum /root/data; test -e /etc/hostname && echo hostname-back; ls /var/log")
	if out != sum+"new\n" {
		t.Errorf("after restore from the archive: %q, want %q", out, sum+"new\n")
	}
	gone("after restore")
	// Archive again, then delete: the object goes too.
	c.StopSandbox(ctx, sb.ID)
	if _, err := c.ArchiveSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	gone("after delete")
	if left := leftovers(data, sb.ID); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
}

// TestArchiveSnapshot archives a snapshot and brings it back by creating a
// sandbox from it and by restoring a sandbox to it.
func TestArchiveSnapshot(t *testing.T) {
	_, data, c := startRooted(t)
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	sum, _ := sh(t, c, sb.ID, "dd if=/dev/urandom of=/root/data bs=1M count=3 2>/dev/null; rm /etc/hostname; md5sum /root/data")
	sn, err := c.CreateSnapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
	if err != nil || sn.State != api.SnapshotReady {
		t.Fatalf("snapshot: %+v %v", sn, err)
	}
	local := filepath.Join(data, "layers", "snapshots", sn.ID)
	object := filepath.Join(data, "archive", "snapshots", sn.ID+".tar")
	archive := func() {
		t.Helper()
		got, err := c.ArchiveSnapshot(ctx, sn.ID)
		if err != nil || got.State != api.SnapshotArchived {
			t.Fatalf("archive snapshot: %+v %v", got, err)
		}
		if _, err := os.Stat(local); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("local snapshot still there: %v", err)
		}
		if fi, err := os.Stat(object); err != nil || fi.Size() < 3<<20 {
			t.Errorf("archive object: %v %v", fi, err)
		}
	}
	archive()
	if _, err := c.ArchiveSnapshot(ctx, sn.ID); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("archive of an archived snapshot: %v, want conflict", err)
	}
	if _, err := c.ArchiveSnapshot(ctx, "aaaaaaaaaaaaaaaaaaaa"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("archive of an unknown snapshot: %v, want not found", err)
	}

	// Creating from it brings it back.
	child := newSandbox(ctx, t, c, api.CreateSandboxRequest{Snapshot: sn.ID})
	want := sum + "gone\n"
	if out, _ := sh(t, c, child.ID, "md5sum /root/data; test -e /etc/hostname || echo gone"); out != want {
		t.Errorf("sandbox from an archived snapshot: %q, want %q", out, want)
	}
	if got, _ := c.GetSnapshot(ctx, sn.ID); got.State != api.SnapshotReady {
		t.Errorf("snapshot after use: %+v", got)
	}
	if _, err := os.Stat(object); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("archive object after the snapshot came back: %v", err)
	}

	// Restoring to it brings it back too.
	archive()
	sh(t, c, sb.ID, "rm /root/data")
	if _, err := c.RestoreSandbox(ctx, sb.ID, api.RestoreRequest{Snapshot: sn.ID}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, c, sb.ID, "md5sum /root/data; test -e /etc/hostname || echo gone"); out != want {
		t.Errorf("sandbox restored to an archived snapshot: %q, want %q", out, want)
	}

	// Deleting an archived snapshot removes its object.
	archive()
	if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(object); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("archive object after delete: %v", err)
	}
	c.DeleteSandbox(ctx, sb.ID)
	c.DeleteSandbox(ctx, child.ID)
}

// TestServeBadArchive checks that an archive URL atoll cannot use stops
// `atoll serve` at startup, before it makes a layer image, saying why.
func TestServeBadArchive(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct{ url, want string }{
		{"gs://bucket", `unsupported scheme "gs"`},
		{"s3://bucket?endpoint=http://127.0.0.1:1&use_path_style=yes", `invalid value for "use_path_style"`},
	} {
		data := filepath.Join(testenv.Dir(t), "data")
		out, err := exec.Command(atollBinary(t), "serve", "--data", data, "--archive", tc.url).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--archive: ") || !strings.Contains(string(out), tc.want) {
			t.Errorf("atoll serve --archive %s: %v: %s, want it to say %s", tc.url, err, out, tc.want)
		}
		if _, err := os.Stat(filepath.Join(data, "layers")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("atoll serve --archive %s made a layer store: %v", tc.url, err)
		}
	}
}
