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
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/internal/readsize"
)

// maxIDXElems bounds the element count an IDX header may announce (1 GiB of
// bytes), so a corrupt header cannot describe an array ReadIDX could not hold.
const maxIDXElems = 1 << 30

// firstReadBytes is the smallest buffer ReadIDX starts with; it doubles while
// data keeps coming, so a header announcing more than the input holds costs
// at most twice what the input does hold (or 8 times a gzip file's size).
const firstReadBytes = 1 << 20

// ReadIDX reads one IDX file (the format of MNIST: a magic number 0x0000TTRR
// with element type TT and rank RR, RR big-endian u32 dimensions, then the
// elements) from r, which may be gzip-compressed (detected by the gzip magic
// bytes 1f 8b). Only unsigned-byte elements (type 0x08) are supported: data
// holds them in row-major order, len(data) = product of shape.
//
// The whole input is checked: it must end where the data of the announced
// shape ends, and a gzip stream is read to its end so that its CRC-32 and
// size are verified. A truncated or damaged file, data after the payload or
// garbage after the gzip stream is an error (truncations wrap
// io.ErrUnexpectedEOF, bad checksums gzip.ErrChecksum), never wrong data.
func ReadIDX(r io.Reader) (shape []int, data []byte, err error) {
	shape, data, err = readIDX(r)
	if err != nil {
		return nil, nil, fmt.Errorf("datasets.ReadIDX: %w", err)
	}
	return shape, data, nil
}

// ReadIDXFile is ReadIDX of the file at path; errors name the file.
func ReadIDXFile(path string) (shape []int, data []byte, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("datasets.ReadIDXFile: %w", err)
	}
	defer f.Close()
	shape, data, err = readIDX(f)
	if err != nil {
		return nil, nil, fmt.Errorf("datasets.ReadIDXFile: %s: %w", path, err)
	}
	return shape, data, nil
}

func readIDX(r io.Reader) (shape []int, data []byte, err error) {
	size := readsize.Remaining(r)
	br := bufio.NewReader(r)
	magic, err := br.Peek(2)
	if err != nil && len(magic) < 2 {
		return nil, nil, fmt.Errorf("reading header: %w", eofUnexpected(err))
	}
	var src io.Reader = br
	compressed := isGzip(magic)
	if compressed {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip header: %w", eofUnexpected(err))
		}
		zr.Multistream(false)
		src = &gzipMembers{br: br, zr: zr}
	}
	var hdr [4]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		return nil, nil, fmt.Errorf("reading header: %w", eofUnexpected(err))
	}
	if hdr[0] != 0 || hdr[1] != 0 {
		return nil, nil, fmt.Errorf("bad magic % x: not an IDX file", hdr)
	}
	if hdr[2] != 0x08 {
		return nil, nil, fmt.Errorf("element type 0x%02x not supported (only 0x08, unsigned byte)", hdr[2])
	}
	rank := int(hdr[3])
	if rank == 0 {
		return nil, nil, errors.New("rank 0 not supported")
	}
	dims := make([]byte, 4*rank)
	if _, err := io.ReadFull(src, dims); err != nil {
		return nil, nil, fmt.Errorf("reading %d dimensions: %w", rank, eofUnexpected(err))
	}
	shape = make([]int, rank)
	n := 1
	for i := range shape {
		d := int(binary.BigEndian.Uint32(dims[4*i:]))
		shape[i] = d
		if d != 0 && n > maxIDXElems/d {
			return nil, nil, fmt.Errorf("shape %v too large (more than %d elements)", shape[:i+1], maxIDXElems)
		}
		n *= d
	}
	first := min(n, firstReadBytes)
	switch {
	case compressed && size >= 0:
		// Start with what 8:1 compression of the input would hold: IDX
		// images compress about 2:1, so a real file is read into one
		// buffer, and a header announcing more than the file holds costs
		// at most 8 times the file before the data runs out.
		first = min(n, max(first, int(min(8*size, maxIDXElems))))
	case size >= 0:
		// An uncompressed input of known size: its size must hold the data.
		if left := size - int64(4+4*rank); int64(n) > left {
			return nil, nil, fmt.Errorf("shape %v: truncated file: the header announces %d bytes of data but only %d follow: %w",
				shape, n, max(left, 0), io.ErrUnexpectedEOF)
		}
		first = n
	}
	data, err = readBytes(src, n, first)
	if err != nil {
		return nil, nil, fmt.Errorf("shape %v: reading %d bytes of data: %w", shape, n, eofUnexpected(err))
	}
	// The input must end here; reading on to the end also makes the gzip
	// reader check the stream's CRC-32 and size.
	var one [1]byte
	k, err := io.ReadFull(src, one[:])
	if k > 0 {
		return nil, nil, fmt.Errorf("trailing data after the IDX payload (%d bytes of shape %v): the file is longer than its header says", n, shape)
	}
	if err != io.EOF {
		return nil, nil, fmt.Errorf("after the data of shape %v: %w", shape, eofUnexpected(err))
	}
	return shape, data, nil
}

func isGzip(magic []byte) bool { return len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b }

// readBytes reads exactly n bytes from r into a buffer of first bytes that
// doubles as data arrives, so that n (from a header) is never allocated
// before the input proves to hold it. A short input is an error wrapping
// io.ErrUnexpectedEOF that says how much was there.
func readBytes(r io.Reader, n, first int) ([]byte, error) {
	buf := make([]byte, first)
	got := 0
	for {
		k, err := io.ReadFull(r, buf[got:])
		got += k
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("only %d present: %w", got, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, err
		}
		if got == n {
			return buf, nil
		}
		next := make([]byte, min(n, 2*len(buf)))
		copy(next, buf)
		buf = next
	}
}

// gzipMembers reads the decompressed data of a gzip file: one member, or
// several concatenated ones (as `cat a.gz b.gz` makes), each checked against
// its CRC-32 and size. Anything after the last member that is not another
// member is an error.
type gzipMembers struct {
	br *bufio.Reader // the compressed input, positioned after the current member once it ends
	zr *gzip.Reader  // the current member, in single-member mode
}

func (m *gzipMembers) Read(p []byte) (int, error) {
	for {
		n, err := m.zr.Read(p)
		if err != io.EOF {
			return n, gzipError(err)
		}
		if n > 0 {
			return n, nil // the next Read reports the member's end again
		}
		// The member ended and its trailer checked out: what follows?
		next, err := m.br.Peek(2)
		if len(next) == 0 && err == io.EOF {
			return 0, io.EOF
		}
		if !isGzip(next) {
			const most = 1 << 20 // count at most this much of it
			rest, _ := io.CopyN(io.Discard, m.br, most+1)
			if rest > most {
				return 0, fmt.Errorf("more than %d bytes of trailing garbage after the gzip stream", most)
			}
			return 0, fmt.Errorf("%d bytes of trailing garbage after the gzip stream", rest)
		}
		if err := m.zr.Reset(m.br); err != nil {
			return 0, fmt.Errorf("gzip member after the first: %w", gzipError(err))
		}
		m.zr.Multistream(false)
	}
}

// gzipError says that an error inside the gzip stream means a damaged file.
func gzipError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("gzip stream cut short: %w", err)
	}
	var corrupt flate.CorruptInputError
	if errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) || errors.Is(err, gzip.ErrHeader) {
		return fmt.Errorf("damaged gzip stream: %w", err)
	}
	return err
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

// Image returns image i as a slice of Images (Features() values). It panics
// with a message naming the problem if i is not in [0, N) or Images is too
// short for image i (a set built by hand; see Validate).
func (s *ImageSet) Image(i int) []float32 {
	if i < 0 || i >= s.N {
		panic(fmt.Sprintf("datasets: ImageSet.Image: image %d out of range [0, %d)", i, s.N))
	}
	f := s.Features()
	if (i+1)*f > len(s.Images) {
		panic(fmt.Sprintf("datasets: ImageSet.Image(%d): the set holds %d pixels, too few for image %d of %d×%d", i, len(s.Images), i, s.Rows, s.Cols))
	}
	return s.Images[i*f : (i+1)*f]
}

// Validate checks that the set is consistent: non-negative sizes, N×Rows×Cols
// pixels and N labels. NewImageSet returns only valid sets; a set built by
// hand can be checked with it.
func (s *ImageSet) Validate() error {
	pixels, err := imageCount(s.N, s.Rows, s.Cols)
	if err != nil {
		return err
	}
	if len(s.Images) != pixels {
		return fmt.Errorf("datasets: the set holds %d pixels, want %d×%d×%d = %d", len(s.Images), s.N, s.Rows, s.Cols, pixels)
	}
	if len(s.Labels) != s.N {
		return fmt.Errorf("datasets: the set holds %d labels, want %d", len(s.Labels), s.N)
	}
	return nil
}

// imageCount is n×rows×cols, or an error for a negative size or a product
// that overflows.
func imageCount(n, rows, cols int) (int, error) {
	if n < 0 || rows < 0 || cols < 0 {
		return 0, fmt.Errorf("datasets: negative size in %d images of %d×%d", n, rows, cols)
	}
	total := 1
	for _, d := range []int{n, rows, cols} {
		if d != 0 && total > math.MaxInt/d {
			return 0, fmt.Errorf("datasets: %d images of %d×%d pixels is too large", n, rows, cols)
		}
		total *= d
	}
	return total, nil
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

func loadImageSet(imagesPath, labelsPath string) (*ImageSet, error) {
	ishape, pix, err := ReadIDXFile(imagesPath)
	if err != nil {
		return nil, err
	}
	lshape, labels, err := ReadIDXFile(labelsPath)
	if err != nil {
		return nil, err
	}
	return NewImageSet(ishape, pix, lshape, labels)
}

// NewImageSet builds an ImageSet from IDX contents: images of shape [N, rows,
// cols] and labels of shape [N]. pixels must hold N×rows×cols values and
// labels N; otherwise the error says what is missing.
func NewImageSet(imageShape []int, pixels []byte, labelShape []int, labels []byte) (*ImageSet, error) {
	if len(imageShape) != 3 {
		return nil, fmt.Errorf("datasets: images have shape %v, want [N, rows, cols]", imageShape)
	}
	if len(labelShape) != 1 || labelShape[0] != imageShape[0] {
		return nil, fmt.Errorf("datasets: labels have shape %v, want [%d]", labelShape, imageShape[0])
	}
	n, rows, cols := imageShape[0], imageShape[1], imageShape[2]
	want, err := imageCount(n, rows, cols)
	if err != nil {
		return nil, err
	}
	if len(pixels) != want {
		return nil, fmt.Errorf("datasets: %d pixels for images of shape %v, want %d", len(pixels), imageShape, want)
	}
	if len(labels) != n {
		return nil, fmt.Errorf("datasets: %d labels for label shape %v, want %d", len(labels), labelShape, n)
	}
	s := &ImageSet{N: n, Rows: rows, Cols: cols}
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
