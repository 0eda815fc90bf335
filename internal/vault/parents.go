package vault

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// quarantineParents returns the parents of commit oid if it is a whole
// (undeltified) commit object in one of the packs a push brought, in its
// quarantine directory q; ok false otherwise. A push of new commits on a
// branch has its tip there, and that tip's parent is most often the
// branch's old value: the fast-forward check then needs no git process
// (isAncestor runs one for every other case).
//
// It reads git's pack index (version 2) and the object's zlib stream; any
// format it does not expect is "not found", never an answer.
func quarantineParents(q, oid string) (parents []string, ok bool) {
	if q == "" {
		return nil, false
	}
	want, err := hex.DecodeString(oid)
	if err != nil || len(want) != 20 {
		return nil, false
	}
	idxs, _ := filepath.Glob(filepath.Join(q, "pack", "pack-*.idx"))
	for _, idx := range idxs {
		off, found := packOffset(idx, want)
		if !found {
			continue
		}
		return commitAt(strings.TrimSuffix(idx, ".idx")+".pack", off)
	}
	return nil, false
}

// packOffset finds the object named want in the version 2 pack index at
// path and returns its offset in the pack.
func packOffset(path string, want []byte) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 8+256*4 || !bytes.Equal(b[:8], []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}) {
		return 0, false
	}
	fan := b[8 : 8+256*4]
	n := int(binary.BigEndian.Uint32(fan[255*4:]))
	names := 8 + 256*4
	crcs := names + 20*n
	offs := crcs + 4*n
	large := offs + 4*n
	if len(b) < large {
		return 0, false
	}
	lo := 0
	if want[0] > 0 {
		lo = int(binary.BigEndian.Uint32(fan[(int(want[0])-1)*4:]))
	}
	hi := int(binary.BigEndian.Uint32(fan[int(want[0])*4:]))
	if lo > hi || hi > n {
		return 0, false
	}
	i := lo + sort.Search(hi-lo, func(i int) bool { return bytes.Compare(b[names+20*(lo+i):names+20*(lo+i)+20], want) >= 0 })
	if i >= hi || !bytes.Equal(b[names+20*i:names+20*i+20], want) {
		return 0, false
	}
	o := binary.BigEndian.Uint32(b[offs+4*i:])
	if o&0x80000000 == 0 {
		return int64(o), true
	}
	j := large + 8*int(o&0x7fffffff)
	if len(b) < j+8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b[j:])), true
}

// maxCommit bounds the commit object read.
const maxCommit = 1 << 20

// commitAt reads the commit object at off in the pack at path and
// returns its parents; ok false unless it is a whole commit.
func commitAt(path string, off int64) ([]string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	r := bufio.NewReader(io.NewSectionReader(f, off, 1<<62))
	c, err := r.ReadByte()
	if err != nil || (c>>4)&7 != 1 { // OBJ_COMMIT; a delta is left to git
		return nil, false
	}
	size, shift := int64(c&15), 4
	for c&0x80 != 0 {
		if c, err = r.ReadByte(); err != nil || shift > 56 {
			return nil, false
		}
		size |= int64(c&0x7f) << shift
		shift += 7
	}
	if size > maxCommit {
		return nil, false
	}
	zr, err := zlib.NewReader(r)
	if err != nil {
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(zr, size))
	if err != nil || int64(len(body)) != size {
		return nil, false
	}
	var parents []string
	for _, l := range strings.Split(string(body), "\n") {
		if l == "" {
			return parents, true // the headers end
		}
		if p, ok := strings.CutPrefix(l, "parent "); ok {
			parents = append(parents, p)
		}
	}
	return nil, false
}
