package cuda

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// The kernel catalog in CUDA C, compiled into the binary: kernels/common.cuh
// and one .cu file per family of kernels.
//
//go:embed kernels/common.cuh kernels/*.cu
var kernelFiles embed.FS

// kernelSource is the catalog as one NVRTC program: common.cuh, then the
// .cu files in name order, each preceded by a #line naming it so that
// NVRTC's log cites the file.
var kernelSource = func() string {
	names, err := fs.Glob(kernelFiles, "kernels/*.cu")
	if err != nil {
		panic(err) // a malformed pattern: a bug here
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range append([]string{"kernels/common.cuh"}, names...) {
		src, err := kernelFiles.ReadFile(n)
		if err != nil {
			panic(err) // embedded above
		}
		fmt.Fprintf(&b, "#line 1 %q\n%s\n", n, src)
	}
	return b.String()
}()

// KernelSource is the CUDA C the node compiles.
func KernelSource() string { return kernelSource }

// compileOptions are NVRTC's options besides the architecture: no fused
// multiply-add, so that products and sums round as the Go references'.
var compileOptions = []string{"--fmad=false", "--std=c++17"}

// cacheMagic starts a cache entry, followed by the SHA-256 of the image
// and the image.
const cacheMagic = "vgpu kernel cache 1\n"

// Compiler builds the catalog for a GPU architecture with NVRTC, once per
// architecture per process, and keeps each image on disk in Dir, named by
// the hash of the source, the options, NVRTC's version and the
// architecture, so that a node restarted with the same binary and toolkit
// does not compile again. An entry that does not hold what it says (its
// hash does not match, or the driver refuses it) is compiled again and
// replaced.
//
// Concurrency: safe for concurrent use; mu guards the fields below it.
type Compiler struct {
	nvrtc *NVRTC
	dir   string // "" keeps no disk cache

	mu       sync.Mutex
	images   map[string][]byte // by architecture
	compiled int               // compilations run
	hits     int               // images read from the disk cache
	corrupt  int               // disk entries found corrupt, or refused by the driver
}

// NewCompiler returns a Compiler over n caching in dir ("" for none),
// which it creates when it first writes there.
func NewCompiler(n *NVRTC, dir string) *Compiler {
	return &Compiler{nvrtc: n, dir: dir, images: map[string][]byte{}}
}

// CompilerStats counts what a Compiler did.
type CompilerStats struct {
	Compiled, CacheHits, Corrupt int
}

// Stats says how many images c compiled, read from its disk cache, and
// found corrupt there.
func (c *Compiler) Stats() CompilerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CompilerStats{c.compiled, c.hits, c.corrupt}
}

// entry is the cache file of arch's image.
func (c *Compiler) entry(arch string) (string, error) {
	v, err := c.nvrtc.Version()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", kernelSource, strings.Join(compileOptions, " "), v, arch)
	return filepath.Join(c.dir, hex.EncodeToString(h.Sum(nil)[:16])+"-"+arch+".cubin"), nil
}

// Image returns the catalog compiled for arch ("sm_90"), and whether it
// came from the disk cache.
func (c *Compiler) Image(arch string) (image []byte, cached bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if img, ok := c.images[arch]; ok {
		return img, false, nil
	}
	path := ""
	if c.dir != "" {
		if path, err = c.entry(arch); err != nil {
			return nil, false, err
		}
		if img, ok := c.read(path); ok {
			c.hits++
			c.images[arch] = img
			return img, true, nil
		}
	}
	img, err := c.nvrtc.Compile(kernelSource, "vgpu_kernels.cu", append([]string{"--gpu-architecture=" + arch}, compileOptions...))
	if err != nil {
		return nil, false, err
	}
	c.compiled++
	c.images[arch] = img
	if path != "" {
		if err := write(path, img); err != nil {
			return nil, false, fmt.Errorf("kernel cache: %w", err)
		}
	}
	return img, false, nil
}

// read reads the entry at path; ok is false if there is none or it is
// corrupt (counted).
func (c *Compiler) read(path string) (img []byte, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	rest, found := bytes.CutPrefix(b, []byte(cacheMagic))
	if found && len(rest) > sha256.Size {
		sum, img := rest[:sha256.Size], rest[sha256.Size:]
		if h := sha256.Sum256(img); bytes.Equal(h[:], sum) {
			return img, true
		}
	}
	c.corrupt++
	return nil, false
}

// write stores img at path whole or not at all (a temporary file renamed).
func write(path string, img []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	sum := sha256.Sum256(img)
	_, err = f.Write(slices.Concat([]byte(cacheMagic), sum[:], img))
	if err = errors.Join(err, f.Close()); err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// forget drops arch's image, in memory and on disk, after the driver
// refused it.
func (c *Compiler) forget(arch string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.images, arch)
	c.corrupt++
	if c.dir != "" {
		if path, err := c.entry(arch); err == nil {
			os.Remove(path)
		}
	}
}

// UseKernels builds the catalog for the device's GPU with c (or takes it
// from c's cache) and loads it, so that launches run on the GPU from now
// on. A cached image the driver refuses is compiled again. It must be
// called before the device serves, at most once.
func (d *Device) UseKernels(c *Compiler) error {
	arch, err := d.ctx.d.Arch(d.ordinal)
	if err != nil {
		return fmt.Errorf("%s: %w", d.info.Name, err)
	}
	img, cached, err := c.Image(arch)
	if err != nil {
		return fmt.Errorf("%s: kernels for %s: %w", d.info.Name, arch, err)
	}
	err = d.load(img)
	if err != nil && cached {
		c.forget(arch)
		if img, _, err = c.Image(arch); err != nil {
			return fmt.Errorf("%s: kernels for %s: %w", d.info.Name, arch, err)
		}
		err = d.load(img)
	}
	if err != nil {
		return fmt.Errorf("%s: kernels for %s: %w", d.info.Name, arch, err)
	}
	return nil
}

// load loads img and finds every kernel of the catalog in it.
func (d *Device) load(img []byte) error {
	return d.do(func(k *Calls) error {
		if d.funcs != nil {
			return fmt.Errorf("kernels loaded already: %w", api.ErrInvalidArgument)
		}
		m, err := k.LoadModule(img)
		if err != nil {
			return err
		}
		funcs := map[string]Function{}
		for _, info := range kernels.Catalog() {
			f, err := k.Function(m, info.Name)
			if err != nil {
				return errors.Join(err, k.Unload(m))
			}
			funcs[info.Name] = f
		}
		d.module, d.funcs = m, funcs
		return nil
	})
}
