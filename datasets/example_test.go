package datasets_test

import (
	"bytes"
	"compress/gzip"
	"fmt"

	"github.com/ferryml/ferry/datasets"
)

// ReadIDX reads an IDX file (plain or gzip'd, as the MNIST files ship) and checks
// all of it: a cut-off or damaged file is an error, never wrong data.
func ExampleReadIDX() {
	// An IDX file of u8 data, shape [2, 3]: magic 0 0 0x08 (u8) 2 (rank), the
	// dimensions as big-endian u32, then the data.
	raw := []byte{0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(raw)
	w.Close()

	shape, data, err := datasets.ReadIDX(bytes.NewReader(gz.Bytes()))
	fmt.Println(shape, data, err)

	// The same file cut short.
	_, _, err = datasets.ReadIDX(bytes.NewReader(gz.Bytes()[:gz.Len()-4]))
	fmt.Println(err != nil)
	// Output:
	// [2 3] [1 2 3 4 5 6] <nil>
	// true
}

// NewImageSet checks that the pixels and labels match their shapes.
func ExampleNewImageSet() {
	pixels := []byte{0, 255, 128, 64}
	set, err := datasets.NewImageSet([]int{2, 1, 2}, pixels, []int{2}, []byte{3, 7})
	if err != nil {
		panic(err)
	}
	fmt.Println(set.Features(), set.Image(1), set.Labels)
	_, err = datasets.NewImageSet([]int{3, 1, 2}, pixels, []int{3}, []byte{3, 7, 1})
	fmt.Println(err)
	// Output:
	// 2 [0.5019608 0.2509804] [3 7]
	// datasets: 4 pixels for images of shape [3 1 2], want 6
}
