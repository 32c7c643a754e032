// Package datasets reads small public datasets from local files: the IDX format
// of MNIST and Fashion-MNIST, gzip-compressed or not.
//
// Ferry downloads nothing. Fashion-MNIST is installed with
//
//	sudo apt-get install dataset-fashion-mnist
//
// (files under /usr/share/datasets/fashion-mnist/), or read from any directory
// holding the four IDX files.
package datasets

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// maxIDXElems bounds the element count an IDX header may announce (1 GiB of
// bytes), so a corrupt header cannot make ReadIDX allocate without limit.
const maxIDXElems = 1 << 30

// ReadIDX reads one IDX file (the format of MNIST: a magic number 0x0000TTRR
// with element type TT and rank RR, RR big-endian u32 dimensions, then the
// elements) from r, which may be gzip-compressed (detected by the gzip magic
// bytes 1f 8b). Only unsigned-byte elements (type 0x08) are supported: data
// holds them in row-major order, len(data) = product of shape.
func ReadIDX(r io.Reader) (shape []int, data []byte, err error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(2)
	if err != nil && len(magic) < 2 {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: reading header: %w", eofUnexpected(err))
	}
	var src io.Reader = br
	if magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("datasets.ReadIDX: gzip: %w", err)
		}
		defer zr.Close()
		src = zr
	}
	var hdr [4]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: reading header: %w", eofUnexpected(err))
	}
	if hdr[0] != 0 || hdr[1] != 0 {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: bad magic % x: not an IDX file", hdr)
	}
	if hdr[2] != 0x08 {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: element type 0x%02x not supported (only 0x08, unsigned byte)", hdr[2])
	}
	rank := int(hdr[3])
	if rank == 0 {
		return nil, nil, errors.New("datasets.ReadIDX: rank 0 not supported")
	}
	dims := make([]byte, 4*rank)
	if _, err := io.ReadFull(src, dims); err != nil {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: reading %d dimensions: %w", rank, eofUnexpected(err))
	}
	shape = make([]int, rank)
	n := 1
	for i := range shape {
		d := int(binary.BigEndian.Uint32(dims[4*i:]))
		shape[i] = d
		if d != 0 && n > maxIDXElems/d {
			return nil, nil, fmt.Errorf("datasets.ReadIDX: shape %v too large", shape[:i+1])
		}
		n *= d
	}
	data = make([]byte, n)
	if _, err := io.ReadFull(src, data); err != nil {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: shape %v: reading %d bytes of data: %w", shape, n, eofUnexpected(err))
	}
	return shape, data, nil
}

func eofUnexpected(err error) error {
	if err == io.EOF {
		return fmt.Errorf("truncated file: %w", io.ErrUnexpectedEOF)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("truncated file: %w", err)
	}
	return err
}

// ImageSet is a labelled image set: N images of Rows×Cols pixels.
type ImageSet struct {
	// Images holds N×Rows×Cols pixels in row-major order, each scaled from
	// 0..255 to [0, 1]: an f32[N, Rows*Cols] matrix.
	Images     []float32
	Labels     []int32 // N class labels
	N          int
	Rows, Cols int
}

// Features is the number of pixels per image, Rows*Cols.
func (s *ImageSet) Features() int { return s.Rows * s.Cols }

// Image returns image i as a slice of Images (Features() values).
func (s *ImageSet) Image(i int) []float32 {
	f := s.Features()
	return s.Images[i*f : (i+1)*f]
}

// DefaultFashionMNISTDir is where `apt-get install dataset-fashion-mnist`
// puts the files.
const DefaultFashionMNISTDir = "/usr/share/datasets/fashion-mnist"

// FashionMNISTFiles are the four IDX files LoadFashionMNIST reads: train
// images and labels, then test images and labels. Each may also be present
// without the .gz suffix, uncompressed.
var FashionMNISTFiles = [4]string{
	"train-images-idx3-ubyte.gz",
	"train-labels-idx1-ubyte.gz",
	"t10k-images-idx3-ubyte.gz",
	"t10k-labels-idx1-ubyte.gz",
}

// ErrNotInstalled is wrapped by LoadFashionMNIST's error when a file is missing.
var ErrNotInstalled = errors.New("dataset not installed")

// LoadFashionMNIST reads Fashion-MNIST (60000 training and 10000 test images of
// 28×28 pixels, 10 classes) from dir; dir "" means DefaultFashionMNISTDir. A
// missing file is an error wrapping ErrNotInstalled that says how to install
// the dataset.
func LoadFashionMNIST(dir string) (train, test *ImageSet, err error) {
	if dir == "" {
		dir = DefaultFashionMNISTDir
	}
	var paths [4]string
	for i, name := range FashionMNISTFiles {
		p, err := findFile(dir, name)
		if err != nil {
			return nil, nil, err
		}
		paths[i] = p
	}
	if train, err = loadImageSet(paths[0], paths[1]); err != nil {
		return nil, nil, err
	}
	if test, err = loadImageSet(paths[2], paths[3]); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

func findFile(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	plain := p[:len(p)-len(".gz")]
	if _, err := os.Stat(plain); err == nil {
		return plain, nil
	}
	return "", fmt.Errorf("datasets: Fashion-MNIST: %s: %w (install it with `sudo apt-get install dataset-fashion-mnist`, "+
		"which puts the files under %s, or pass -data DIR with a directory holding %s, %s, %s and %s)",
		p, ErrNotInstalled, DefaultFashionMNISTDir,
		FashionMNISTFiles[0], FashionMNISTFiles[1], FashionMNISTFiles[2], FashionMNISTFiles[3])
}

func readIDXFile(path string) ([]int, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	shape, data, err := ReadIDX(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return shape, data, nil
}

func loadImageSet(imagesPath, labelsPath string) (*ImageSet, error) {
	ishape, pix, err := readIDXFile(imagesPath)
	if err != nil {
		return nil, err
	}
	lshape, labels, err := readIDXFile(labelsPath)
	if err != nil {
		return nil, err
	}
	return NewImageSet(ishape, pix, lshape, labels)
}

// NewImageSet builds an ImageSet from IDX contents: images of shape [N, rows,
// cols] and labels of shape [N].
func NewImageSet(imageShape []int, pixels []byte, labelShape []int, labels []byte) (*ImageSet, error) {
	if len(imageShape) != 3 {
		return nil, fmt.Errorf("datasets: images have shape %v, want [N, rows, cols]", imageShape)
	}
	if len(labelShape) != 1 || labelShape[0] != imageShape[0] {
		return nil, fmt.Errorf("datasets: labels have shape %v, want [%d]", labelShape, imageShape[0])
	}
	s := &ImageSet{N: imageShape[0], Rows: imageShape[1], Cols: imageShape[2]}
	s.Images = make([]float32, len(pixels))
	for i, p := range pixels {
		s.Images[i] = float32(p) / 255
	}
	s.Labels = make([]int32, len(labels))
	for i, l := range labels {
		s.Labels[i] = int32(l)
	}
	return s, nil
}
