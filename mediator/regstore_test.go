package mediator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/isolation"
)

// testRegistration is a registration of container id in namespace ns.
func testRegistration(ns, id string) registration {
	g := isolation.Grant{Namespace: ns, Container: id, Tenant: "team-a", Memory: 8 << 20, Compute: 2, Devices: 1}
	t := &isolation.Tenant{Name: "team-a", Memory: 64 << 20, Compute: 3, ComputeMax: 0.5, Bandwidth: 1 << 30, MaxContainers: 4,
		DefaultMemory: 1 << 20, Oversubscribe: 1.5, DedupCharge: 0.25}
	return newRegistration(g, t, process{pid: 1234, start: 5678}, "boot", vocab.HostSocketDir("/run/vgpu/containers", ns, id), ns != "")
}

// openStore opens the store in dir, failing the test on an error.
func openStore(t *testing.T, dir string) (*regStore, loaded) {
	t.Helper()
	s, got, err := openRegStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s, got
}

// Registrations written come back whole, oldest first; a removed one does
// not; the file is the store's alone.
func TestRegStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, got := openStore(t, dir)
	if len(got.regs)+len(got.bad) != 0 || got.lost != nil {
		t.Fatalf("a new store holds %+v", got)
	}
	var want []registration
	for _, k := range []ctrKey{{"moby", "b"}, {"", "a"}, {"k8s.io", "b"}} {
		r := testRegistration(k.namespace, k.id)
		if err := s.put(r); err != nil {
			t.Fatal(err)
		}
		want = append(want, r)
		time.Sleep(time.Millisecond) // registered in this order
	}
	if _, _, err := openRegStore(dir); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "held by another process") {
		t.Fatalf("a second opening of a held store: %v, want unavailable", err)
	}
	s.close()
	s, got = openStore(t, dir)
	if got.lost != nil || len(got.bad) != 0 || !reflect.DeepEqual(got.regs, want) {
		t.Fatalf("reopened: %+v\nwant registrations %+v", got, want)
	}
	if err := s.remove(ctrKey{"moby", "b"}); err != nil {
		t.Fatal(err)
	}
	if err := s.remove(ctrKey{"moby", "never"}); err != nil {
		t.Fatalf("removing what is not there: %v", err)
	}
	s.close()
	_, got = openStore(t, dir)
	if !reflect.DeepEqual(got.regs, want[1:]) {
		t.Fatalf("after a removal: %+v\nwant %+v", got.regs, want[1:])
	}
}

// A store whose file is not one — garbage, truncated, cut below its meta
// pages, of a newer format — is moved aside, intact, and reported naming the
// file and the problem; an empty store takes its place and works.
func TestRegStoreUnreadableFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, path string)
		want  string
	}{
		{"garbage", func(t *testing.T, path string) {
			write(t, path, bytes.Repeat([]byte("not a store "), 2000))
		}, "not a bbolt file"},
		{"truncated", func(t *testing.T, path string) {
			truncate(t, path, func(size int64) int64 { return size / 2 })
		}, "truncated"},
		{"truncated within its meta pages", func(t *testing.T, path string) {
			truncate(t, path, func(int64) int64 { return 5000 }) // of two pages of 4 KiB
		}, "file size too small"},
		{"page of another type", func(t *testing.T, path string) {
			pages(t, path, func(p []byte) {
				if bytes.Contains(p, []byte(`"container":"c1`)) {
					p[8], p[9] = 0xff, 0xff // flags
				}
			})
		}, "reading it failed"},
		// bbolt reads the file through a memory map, of a power of two
		// bytes: in a file cut to its used pages and one more, a page past
		// the file's end but within the map faults with SIGBUS; one past
		// the map with SIGSEGV.
		{"branch to a page past the file", func(t *testing.T, path string) {
			var used int64
			view(t, path, func(tx *bolt.Tx) { used = tx.Size() })
			truncate(t, path, func(int64) int64 { return used + 4096 })
			branchTo(t, path, func(size int64) uint64 { return uint64(size/4096 + 1) })
		}, "reading it failed"},
		{"branch to a page far past the file", func(t *testing.T, path string) {
			branchTo(t, path, func(int64) uint64 { return 1 << 20 })
		}, "reading it failed"},
		{"newer format", func(t *testing.T, path string) {
			update(t, path, func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(versionKey, []byte("2")) })
		}, "format version 2, newer than this vgpu-mediator's 1"},
		{"no version", func(t *testing.T, path string) {
			update(t, path, func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Delete(versionKey) })
		}, `format version ""`},
		{"no containers", func(t *testing.T, path string) {
			update(t, path, func(tx *bolt.Tx) error { return tx.DeleteBucket(containersBucket) })
		}, `bucket "meta" or "containers" missing`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, regFileName)
			s, _ := openStore(t, dir)
			for i := range 200 { // several pages of records
				if err := s.put(testRegistration("moby", fmt.Sprintf("c%03d", i))); err != nil {
					t.Fatal(err)
				}
			}
			s.close()
			tc.spoil(t, path)
			spoilt, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, got := openStore(t, dir)
			if got.lost == nil || !strings.Contains(got.lost.Error(), path) || !strings.Contains(got.lost.Error(), tc.want) {
				t.Fatalf("lost: %v, want an error naming %s and %q", got.lost, path, tc.want)
			}
			if len(got.regs)+len(got.bad) != 0 {
				t.Fatalf("records restored from an unreadable file: %+v", got)
			}
			if kept, err := os.ReadFile(got.aside); err != nil || !bytes.Equal(kept, spoilt) {
				t.Fatalf("the unreadable file was not kept at %q as it was: %v", got.aside, err)
			}
			r := testRegistration("", "after")
			if err := s.put(r); err != nil {
				t.Fatal(err)
			}
			s.close()
			if _, got = openStore(t, dir); got.lost != nil || !reflect.DeepEqual(got.regs, []registration{r}) {
				t.Fatalf("the new store after reopening: %+v", got)
			}
		})
	}
}

// A record that fails its checks is reported, naming its problem, and
// deleted; the others are restored. A flipped bit in a record's data page,
// which bbolt does not notice, is caught by the record's checksum.
func TestRegStoreBadRecords(t *testing.T) {
	good := testRegistration("moby", "good")
	for _, tc := range []struct {
		name  string
		key   string
		value func(t *testing.T) []byte
		want  string
	}{
		{"short", "moby\x00c", func(*testing.T) []byte { return []byte{1, 2} }, "too short"},
		{"checksum", "moby\x00c", func(t *testing.T) []byte {
			v := encoded(t, testRegistration("moby", "c"))
			v[len(v)-3] ^= 1
			return v
		}, "checksum"},
		{"unknown field", "moby\x00c", func(t *testing.T) []byte {
			return seal([]byte(`{"namespace":"moby","container":"c","from_the_future":1}`))
		}, "from_the_future"},
		{"trailing data", "moby\x00c", func(t *testing.T) []byte {
			return seal([]byte(`{"namespace":"moby","container":"c"} {}`))
		}, "data after"},
		{"wrong key", "moby\x00other", func(t *testing.T) []byte { return encoded(t, testRegistration("moby", "c")) }, "stored under key"},
		{"bad id", "moby\x00../x", func(t *testing.T) []byte { return encoded(t, testRegistration("moby", "../x")) }, `container id "../x"`},
		{"relative socket directory", "moby\x00c", func(t *testing.T) []byte {
			r := testRegistration("moby", "c")
			r.SocketDir = "run/x"
			return encoded(t, r)
		}, `socket directory "run/x"`},
		{"negative pid", "moby\x00c", func(t *testing.T) []byte {
			r := testRegistration("moby", "c")
			r.Pid = -1
			return encoded(t, r)
		}, "pid -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := openStore(t, dir)
			if err := s.put(good); err != nil {
				t.Fatal(err)
			}
			s.close()
			update(t, filepath.Join(dir, regFileName), func(tx *bolt.Tx) error {
				return tx.Bucket(containersBucket).Put([]byte(tc.key), tc.value(t))
			})
			s, got := openStore(t, dir)
			if len(got.bad) != 1 || string(got.bad[0].key) != tc.key || !strings.Contains(got.bad[0].err.Error(), tc.want) {
				t.Fatalf("bad records %+v, want one under %q saying %q", got.bad, tc.key, tc.want)
			}
			if got.lost != nil || !reflect.DeepEqual(got.regs, []registration{good}) {
				t.Fatalf("the good record: %+v", got)
			}
			s.close()
			if _, got = openStore(t, dir); len(got.bad) != 0 || len(got.regs) != 1 {
				t.Fatalf("after reopening, the bad record is still there: %+v", got)
			}
		})
	}

	t.Run("bit flipped on disk", func(t *testing.T) {
		dir := t.TempDir()
		s, _ := openStore(t, dir)
		r := testRegistration("moby", "c")
		r.Memory = 0x1234567
		if err := s.put(r); err != nil {
			t.Fatal(err)
		}
		s.close()
		path := filepath.Join(dir, regFileName)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(b, []byte(`"memory":19088743`))
		if i < 0 {
			t.Fatal("the record's memory is not in the file")
		}
		b[i+len(`"memory":`)] = '9' // 99088743 bytes: still a registration, a wrong one
		write(t, path, b)
		_, got := openStore(t, dir)
		if len(got.regs) != 0 || len(got.bad) != 1 || !strings.Contains(got.bad[0].err.Error(), "checksum") {
			t.Fatalf("a record changed on disk: %+v, want it refused for its checksum", got)
		}
	})
}

func encoded(t *testing.T, r registration) []byte {
	t.Helper()
	v, err := r.encode()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// truncate cuts the file at path to the size to returns for its size.
func truncate(t *testing.T, path string, to func(int64) int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, to(fi.Size())); err != nil {
		t.Fatal(err)
	}
}

// pages changes the file at path page by page, pages of 4 KiB.
func pages(t *testing.T, path string, change func(page []byte)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for p := 2 * 4096; p+4096 <= len(b); p += 4096 { // past the meta pages
		change(b[p : p+4096])
	}
	write(t, path, b)
}

// branchTo points the first element of every branch page of the file at
// path to the page that page returns for the file's size.
func branchTo(t *testing.T, path string, page func(size int64) uint64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	pages(t, path, func(p []byte) {
		if p[8] == 0x01 { // branch page flag; elements from byte 16: pos, ksize, then the page id
			binary.LittleEndian.PutUint64(p[16+8:], page(fi.Size()))
		}
	})
}

// view reads the bbolt file at path in one transaction.
func view(t *testing.T, path string, f func(*bolt.Tx)) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error { f(tx); return nil })
}

// update changes the bbolt file at path in one transaction.
func update(t *testing.T, path string, f func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(f); err != nil {
		t.Fatal(err)
	}
}

// FuzzDecodeRecord: whatever bytes a damaged file holds under a key,
// decoding them never panics, and a record it accepts encodes back to one
// that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	good := testRegistration("moby", "c")
	v, err := good.encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("moby\x00c"), v)
	f.Add([]byte("moby\x00c"), seal([]byte(`{"namespace":"moby","container":"c","pid":-1}`)))
	f.Add([]byte("\x00c"), seal([]byte(`{"container":"c","socket_dir":"/x"}`)))
	f.Fuzz(func(t *testing.T, key, v []byte) {
		r, err := decodeRecord(key, v)
		if err != nil {
			return
		}
		again, err := r.encode()
		if err != nil {
			t.Fatalf("an accepted record %+v does not encode: %v", r, err)
		}
		r2, err := decodeRecord(key, again)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("an accepted record %+v encodes to one that decodes to %+v, %v", r, r2, err)
		}
	})
}
