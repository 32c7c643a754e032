package settings_test

import (
	"fmt"

	"github.com/ferryml/ferry/internal/settings"
)

// A typed read of a variable, and the error of a bad value.
func ExampleSetting_Lookup() {
	restore, _ := settings.Set("FERRY_MEM_FRACTION", "0.5", true)
	f, set, err := settings.MemFraction.Lookup()
	fmt.Println(f, set, err)
	restore()

	restore, _ = settings.Set("FERRY_MEM_FRACTION", "1.5", true)
	defer restore()
	f, set, err = settings.MemFraction.Lookup()
	fmt.Println(f, set, err)
	// Output:
	// 0.5 true <nil>
	// 0.75 true FERRY_MEM_FRACTION="1.5": want a number in (0, 1]
}
