package gitpack_test

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"testing"

	"github.com/atoll-dev/atoll/internal/vault/gitpack"
)

// mkPack is a pack of entries, with its checksum.
func mkPack(entries ...[]byte) []byte {
	var b bytes.Buffer
	b.WriteString("PACK")
	binary.Write(&b, binary.BigEndian, uint32(2))
	binary.Write(&b, binary.BigEndian, uint32(len(entries)))
	for _, e := range entries {
		b.Write(e)
	}
	s := sha1.Sum(b.Bytes())
	b.Write(s[:])
	return b.Bytes()
}

// z is p compressed with zlib.
func z(p []byte) []byte {
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	w.Write(p)
	w.Close()
	return b.Bytes()
}

// FuzzRead reads, completes and indexes mutated packs, and parses their
// objects: errors only, never a panic or a hang.
//
//	go test -run - -fuzz FuzzRead ./internal/vault/gitpack
func FuzzRead(f *testing.F) {
	blob := append([]byte{0x30 | 5}, z([]byte("hello"))...)
	f.Add(mkPack(blob))
	// an ofs-delta on it: copy 5, insert "!"
	delta := append([]byte{0x60 | 8, byte(len(blob))}, z([]byte{5, 6, 0x90, 5, 1, '!'})...)
	f.Add(mkPack(blob, delta))
	base := gitpack.Hash(gitpack.Blob, []byte("hello"))
	ref := append(append([]byte{0x70 | 8}, base[:]...), z([]byte{5, 6, 0x90, 5, 1, '!'})...)
	f.Add(mkPack(ref))
	f.Add(mkPack(blob, ref, delta))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Fix the trailer so that mutations get past the checksum.
		if len(b) >= 32 {
			b = append([]byte(nil), b...)
			s := sha1.Sum(b[:len(b)-20])
			copy(b[len(b)-20:], s[:])
		}
		ext := func(o gitpack.OID) (int, []byte, bool) {
			if o == base {
				return gitpack.Blob, []byte("hello"), true
			}
			return 0, nil, false
		}
		p, err := gitpack.Read(b, ext, gitpack.Limits{Objects: 2000, Bytes: 1 << 20})
		if err != nil {
			return
		}
		data, objs, err := p.Complete()
		if err != nil {
			return
		}
		gitpack.Index(data, objs)
		for _, o := range p.Objects {
			gitpack.ParseTree(o.Data)
			gitpack.ParseCommit(o.Data)
		}
	})
}

// FuzzParse parses mutated trees and commits.
func FuzzParse(f *testing.F) {
	f.Add([]byte("tree 0123456789012345678901234567890123456789\nauthor a <b> 1 +0000\ncommitter a <b> 1 +0000\n\nm"))
	f.Add([]byte("100644 a\x0001234567890123456789"))
	f.Fuzz(func(t *testing.T, b []byte) {
		gitpack.ParseTree(b)
		gitpack.ParseCommit(b)
	})
}
