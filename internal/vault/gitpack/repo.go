package gitpack

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
)

// Repo reads the objects of a bare repository: those of its packs,
// through their version 2 indexes, and its loose ones.
type Repo struct {
	objects string // the objects directory
	packs   []packIndex
	files   map[string]*os.File
}

type packIndex struct {
	pack string // the pack's path
	idx  []byte
}

// OpenRepo opens the bare repository at dir for reading. The packs are
// those there now.
func OpenRepo(dir string) (*Repo, error) { return open(filepath.Join(dir, "objects"), true) }

// OpenObjects opens objects directory dir for reading, its indexes not
// kept: the quarantine git receive-pack keeps a push's objects in.
func OpenObjects(dir string) (*Repo, error) { return open(dir, false) }

func open(dir string, keep bool) (*Repo, error) {
	r := &Repo{objects: dir, files: map[string]*os.File{}}
	idxs, err := filepath.Glob(filepath.Join(dir, "pack", "pack-*.idx"))
	if err != nil {
		return nil, err
	}
	for _, p := range idxs {
		b, err := readIndex(p, keep)
		if err != nil {
			return nil, err
		}
		r.packs = append(r.packs, packIndex{pack: p[:len(p)-len(".idx")] + ".pack", idx: b})
	}
	return r, nil
}

// Close closes the pack files Read opened.
func (r *Repo) Close() {
	for _, f := range r.files {
		f.Close()
	}
}

// indexes keeps the indexes read: a pack's index never changes under its
// name (the pack's checksum), and every push reads every index of its
// repository. Bounded: past maxIndexes bytes, all are dropped.
var indexes = struct {
	sync.Mutex
	m     map[string][]byte
	bytes int
}{m: map[string][]byte{}}

const maxIndexes = 64 << 20

func readIndex(p string, keep bool) ([]byte, error) {
	indexes.Lock()
	b, ok := indexes.m[p]
	indexes.Unlock()
	if ok {
		return b, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if len(b) < 8+256*4+40 || !bytes.Equal(b[:8], []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}) {
		return nil, fmt.Errorf("%s: not a version 2 pack index", p)
	}
	n := int(binary.BigEndian.Uint32(b[8+255*4:]))
	if len(b) < 8+256*4+n*28+40 {
		return nil, fmt.Errorf("%s: truncated", p)
	}
	if !keep {
		return b, nil
	}
	indexes.Lock()
	if indexes.bytes+len(b) > maxIndexes {
		indexes.m, indexes.bytes = map[string][]byte{}, 0
	}
	indexes.m[p] = b
	indexes.bytes += len(b)
	indexes.Unlock()
	return b, nil
}

// find looks o up in index b: its offset in the pack.
func find(b []byte, o OID) (int64, bool) {
	fan := b[8 : 8+256*4]
	n := int(binary.BigEndian.Uint32(fan[255*4:]))
	names := 8 + 256*4
	offs := names + 24*n
	large := offs + 4*n
	lo := 0
	if o[0] > 0 {
		lo = int(binary.BigEndian.Uint32(fan[(int(o[0])-1)*4:]))
	}
	hi := int(binary.BigEndian.Uint32(fan[int(o[0])*4:]))
	if lo > hi || hi > n {
		return 0, false
	}
	i := lo + sort.Search(hi-lo, func(i int) bool {
		return bytes.Compare(b[names+20*(lo+i):names+20*(lo+i)+20], o[:]) >= 0
	})
	if i >= hi || !bytes.Equal(b[names+20*i:names+20*i+20], o[:]) {
		return 0, false
	}
	off := binary.BigEndian.Uint32(b[offs+4*i:])
	if off&0x80000000 == 0 {
		return int64(off), true
	}
	j := large + 8*int(off&0x7fffffff)
	if len(b) < j+8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b[j:])), true
}

func (r *Repo) loose(o OID) string {
	s := o.String()
	return filepath.Join(r.objects, s[:2], s[2:])
}

// maxChain bounds the deltas followed to read one object.
const maxChain = 10000

// Read reads object o, of at most max bytes.
func (r *Repo) Read(o OID, max int64) (typ int, data []byte, err error) {
	return r.read(o, max, 0)
}

func (r *Repo) read(o OID, max int64, depth int) (int, []byte, error) {
	if depth > maxChain {
		return 0, nil, errors.New("gitpack: delta chain too long")
	}
	var packErr error
	for _, p := range r.packs {
		if off, ok := find(p.idx, o); ok {
			typ, data, err := r.readPacked(p.pack, off, max, depth)
			if err == nil {
				return typ, data, nil
			}
			packErr = err // an index without its pack: another may hold o
		}
	}
	if packErr != nil {
		return 0, nil, packErr
	}
	f, err := os.Open(r.loose(o))
	if err != nil {
		return 0, nil, fmt.Errorf("gitpack: object %s: %w", o, err)
	}
	defer f.Close()
	zr, err := zlib.NewReader(bufio.NewReader(f))
	if err != nil {
		return 0, nil, err
	}
	br := bufio.NewReader(io.LimitReader(zr, 64))
	hdr, err := br.ReadString(0)
	if err != nil {
		return 0, nil, fmt.Errorf("gitpack: loose object %s: bad header", o)
	}
	name, sz, _ := bytes.Cut([]byte(hdr[:len(hdr)-1]), []byte(" "))
	size, err := strconv.ParseInt(string(sz), 10, 64)
	typ := 0
	for t, n := range typeNames {
		if n == string(name) {
			typ = t
		}
	}
	if err != nil || typ == 0 || size < 0 || size > max {
		return 0, nil, fmt.Errorf("gitpack: loose object %s: bad or too large", o)
	}
	data := make([]byte, size)
	rest, _ := io.ReadAll(br) // what the header's read took past it
	n := copy(data, rest)
	if _, err := io.ReadFull(zr, data[n:]); err != nil {
		return 0, nil, fmt.Errorf("gitpack: loose object %s: %w", o, err)
	}
	return typ, data, nil
}

func (r *Repo) readPacked(pack string, off, max int64, depth int) (int, []byte, error) {
	f := r.files[pack]
	if f == nil {
		var err error
		if f, err = os.Open(pack); err != nil {
			return 0, nil, err
		}
		r.files[pack] = f
	}
	br := bufio.NewReader(io.NewSectionReader(f, off, 1<<62))
	h, err := readHeader(br, off)
	if err != nil {
		return 0, nil, err
	}
	typ, size := h.typ, h.size
	var baseTyp int
	var base []byte
	switch typ {
	case ofsDelta:
		if baseTyp, base, err = r.readPacked(pack, h.base, max, depth+1); err != nil {
			return 0, nil, err
		}
	case refDelta:
		if baseTyp, base, err = r.read(h.baseID, max, depth+1); err != nil {
			return 0, nil, err
		}
	}
	if size > uint64(max) {
		return 0, nil, errors.New("gitpack: object larger than allowed")
	}
	zr, err := zlib.NewReader(br)
	if err != nil {
		return 0, nil, err
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(zr, data); err != nil {
		return 0, nil, err
	}
	if typ < ofsDelta {
		return typ, data, nil
	}
	out, err := applyDelta(base, data, max)
	return baseTyp, out, err
}

// Type is the type of object o: read from its entry's header, and for a
// delta its base's, without inflating it; 0 if o is not to be read.
func (r *Repo) Type(o OID) int { return r.typeOf(o, 0) }

func (r *Repo) typeOf(o OID, depth int) int {
	if depth > maxChain {
		return 0
	}
	for _, p := range r.packs {
		if off, ok := find(p.idx, o); ok {
			if t := r.packedType(p.pack, off, depth); t != 0 {
				return t
			}
		}
	}
	return r.looseType(o)
}

// looseType reads the type of loose object o from its header alone.
func (r *Repo) looseType(o OID) int {
	f, err := os.Open(r.loose(o))
	if err != nil {
		return 0
	}
	defer f.Close()
	zr, err := zlib.NewReader(bufio.NewReader(f))
	if err != nil {
		return 0
	}
	var hdr [8]byte
	n, _ := io.ReadFull(zr, hdr[:])
	name, _, ok := bytes.Cut(hdr[:n], []byte(" "))
	if !ok {
		return 0
	}
	for t, tn := range typeNames {
		if tn == string(name) {
			return t
		}
	}
	return 0
}

func (r *Repo) packedType(pack string, off int64, depth int) int {
	for ; depth <= maxChain; depth++ {
		f := r.files[pack]
		if f == nil {
			var err error
			if f, err = os.Open(pack); err != nil {
				return 0
			}
			r.files[pack] = f
		}
		// A header is 32 bytes at most: a size of up to 10, then a
		// ref-delta's 20-byte name or an ofs-delta's offset.
		var buf [32]byte
		n, _ := f.ReadAt(buf[:], off)
		h, err := readHeader(bytes.NewReader(buf[:n]), off)
		switch {
		case err != nil:
			return 0
		case h.typ == ofsDelta:
			off = h.base
		case h.typ == refDelta:
			return r.typeOf(h.baseID, depth+1)
		default:
			return h.typ
		}
	}
	return 0
}
