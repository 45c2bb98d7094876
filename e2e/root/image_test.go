package root

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // go-digest's sha256
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// epoch is the modification time of every file in the image, so that the
// tar is the same from run to run.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// writeRootfs makes the base of the test image in dir: a static busybox
// with a symlink per applet, and the directories and /etc files a
// container expects. The static test programs are built into it later.
func writeRootfs(dir string) error {
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "run", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return err
	}
	if err := copyFile(filepath.Join(dir, "bin", "busybox"), bb, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range lines(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(dst, src string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// cloneTree copies the tree at src to dst: directories and symlinks anew,
// regular files as hard links (copies where linking fails). A bundle's
// rootfs is read-only in the container, so sharing file data is safe.
func cloneTree(dst, src string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			return os.Chmod(target, info.Mode().Perm()|info.Mode()&fs.ModeSticky)
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		default:
			if os.Link(p, target) == nil {
				return nil
			}
			return copyFile(target, p, info.Mode().Perm())
		}
	})
}

// tarDir writes the tree at dir as a tar stream, owned by root, with fixed
// times, in lexical order.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		if d.Type()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// ociArchive builds, in memory, an OCI image layout archive (oci-layout,
// index.json, blobs) of one image named name: a config and one gzip layer
// holding the tar at layerTar. The index's manifest carries
// io.containerd.image.name, which containerd's Import uses as the name.
func ociArchive(name, layerTar string) ([]byte, error) {
	raw, err := os.ReadFile(layerTar)
	if err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	platform := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	blobs := map[digest.Digest][]byte{}
	add := func(mediaType string, b []byte) ocispec.Descriptor {
		d := digest.FromBytes(b)
		blobs[d] = b
		return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
	}
	created := epoch
	config, err := json.Marshal(ocispec.Image{
		Created:  &created,
		Platform: platform,
		Config:   ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/sh"}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(raw)}},
	})
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    add(ocispec.MediaTypeImageConfig, config),
		Layers:    []ocispec.Descriptor{add(ocispec.MediaTypeImageLayerGzip, gz.Bytes())},
	})
	if err != nil {
		return nil, err
	}
	md := add(ocispec.MediaTypeImageManifest, manifest)
	md.Platform = &platform
	md.Annotations = map[string]string{
		"io.containerd.image.name": name,
		ocispec.AnnotationRefName:  name[strings.LastIndex(name, ":")+1:],
	}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{md},
	})
	if err != nil {
		return nil, err
	}
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})

	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := file(ocispec.ImageLayoutFile, layout); err != nil {
		return nil, err
	}
	if err := file("index.json", index); err != nil {
		return nil, err
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
			return nil, err
		}
	}
	for d, b := range blobs {
		if err := file("blobs/sha256/"+d.Encoded(), b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
