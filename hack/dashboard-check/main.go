// dashboard-check validates Grafana dashboard JSON files the way Grafana's own
// schema types do: github.com/grafana/grafana-foundation-sdk/go (types
// generated from Grafana's dashboard schema and its panel and data source
// plugins' schemas). A file passes when its strict decoding (no unknown field,
// no wrong type, no missing required field, panel options and queries checked
// against their plugin's schema) and the schema's constraints both pass.
//
//	dashboard-check FILE...
//
// Prints "FILE: ok" per valid file; for an invalid one, every problem with its
// path, and exits 1. Built by hack/build-tools.sh.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// problems is err, or nil when err is an empty list of build errors (the SDK's
// decoders return their list as an error even when it is empty).
func problems(err error) error {
	var list cog.BuildErrors
	if errors.As(err, &list) && len(list) == 0 {
		return nil
	}
	return err
}

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var board dashboard.Dashboard
	if err := problems(board.UnmarshalJSONStrict(raw)); err != nil {
		return fmt.Errorf("strict decoding: %w", err)
	}
	if err := problems(board.Validate()); err != nil {
		return fmt.Errorf("constraints: %w", err)
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check FILE...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Printf("%s: invalid: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s: ok\n", path)
	}
	if failed {
		os.Exit(1)
	}
}
