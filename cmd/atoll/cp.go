package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newCpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories into or out of a sandbox",
		Long: `Copy a file or directory between this machine and a sandbox. Write the sandbox
side as ID:/absolute/path. As with cp -r: if DST is an existing directory, SRC is
copied into it under its own name; otherwise SRC is copied to DST.
Directories travel as tar streams; files keep their permission bits.`,
		Example: `  atoll cp ./src 3k9x2m7q1w8e5r4t6y0u:/work/src
  atoll cp 3k9x2m7q1w8e5r4t6y0u:/work/out/report.txt .`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseLoc(args[0]), parseLoc(args[1])
			for _, l := range []loc{src, dst} {
				if l.id != "" && !path.IsAbs(l.path) {
					return fmt.Errorf("%s:%s: the sandbox path must be absolute", l.id, l.path)
				}
			}
			switch {
			case src.id != "" && dst.id != "":
				return errors.New("cp: copying between two sandboxes is not supported; copy through this machine")
			case src.id == "" && dst.id == "":
				return errors.New("cp: neither SRC nor DST is in a sandbox (write ID:/path)")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if dst.id != "" {
				return upload(cmd.Context(), c, src.path, dst)
			}
			return download(cmd.Context(), c, src, dst.path)
		},
	}
}

// loc is a cp argument: a path inside sandbox id, or a local path if id is "".
type loc struct{ id, path string }

// parseLoc reads ID:/path; anything whose part before the first colon holds a
// slash or dot is a local path, as in scp.
func parseLoc(s string) loc {
	if i := strings.IndexByte(s, ':'); i > 0 && !strings.ContainsAny(s[:i], `/\.`) {
		return loc{id: s[:i], path: s[i+1:]}
	}
	return loc{path: s}
}

func upload(ctx context.Context, c *atoll.Client, src string, dst loc) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	target := dst.path
	if fi, err := c.Stat(ctx, dst.id, dst.path); err == nil && fi.Type == "dir" {
		target = path.Join(dst.path, filepath.Base(filepath.Clean(src)))
	} else if err != nil && !errors.Is(err, atoll.ErrNotFound) {
		return err
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = c.WriteFile(ctx, dst.id, target, f, uint32(st.Mode().Perm()))
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, src)) }()
	err = c.UploadTar(ctx, dst.id, target, pr)
	pr.CloseWithError(errors.New("upload ended")) // stops writeTar if the upload failed early
	return err
}

// writeTar writes the contents of directory dir to w as a tar stream.
func writeTar(w io.Writer, dir string) error { return writeTarFunc(w, dir, nil) }

// writeTarFunc writes the contents of directory dir to w as a tar stream
// holding the entries keep accepts, or all if keep is nil. keep is given an
// entry's slash-separated path relative to dir; a directory it refuses is
// still walked unless keep also returns fs.SkipDir.
func writeTarFunc(w io.Writer, dir string, keep func(rel string, d fs.DirEntry) (bool, error)) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		if keep != nil {
			ok, err := keep(filepath.ToSlash(rel), d)
			if !ok || err != nil {
				return err
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil // sockets, devices, fifos: not copied
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func download(ctx context.Context, c *atoll.Client, src loc, dst string) error {
	fi, err := c.Stat(ctx, src.id, src.path)
	if err != nil {
		return err
	}
	target := dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		target = filepath.Join(dst, path.Base(src.path))
	}
	if fi.Type != "dir" {
		rc, err := c.ReadFile(ctx, src.id, src.path)
		if err != nil {
			return err
		}
		defer rc.Close()
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fs.FileMode(fi.Mode&0o777))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, rc); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	rc, err := c.DownloadTar(ctx, src.id, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	return extractTar(rc, target)
}

// extractTar extracts a tar stream from a sandbox into dir. The stream is
// untrusted: everything goes through an os.Root, so no name or symlink can
// reach outside dir, and no setuid, setgid or sticky bit is kept.
func extractTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading tar stream: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if name == "." {
			continue
		}
		if !fs.ValidPath(name) {
			return fmt.Errorf("tar stream: refusing entry %q", hdr.Name)
		}
		perm := fs.FileMode(hdr.Mode) & 0o777
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
			if err := root.Chmod(name, perm|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			root.Remove(name) // replace, never write through, an existing symlink
			f, err := root.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_EXCL, perm)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
		default:
			// Hard links, devices and fifos are not copied out of a sandbox.
		}
	}
}
