package checkpoint

// SetStepHook sets the function called at each step of writing files that a
// crash could interrupt (nil: none), for the tests that kill saves there.
func SetStepHook(f func(step string)) { stepHook = f }
