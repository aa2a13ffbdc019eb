package main

import (
	"github.com/rpac-dev/rpac/runtime"
	"github.com/urfave/cli/v2"
)

// exportFolderFlag names the export folder that eval, generate and serve run.
func exportFolderFlag() cli.Flag {
	return &cli.StringFlag{Name: "model", Usage: "export folder (written by rpac export)", Required: true}
}

// sessionFlags choose where and on how many threads onnxruntime runs the export.
func sessionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "provider", Value: "cpu", Usage: "onnxruntime execution provider: cpu|cuda"},
		&cli.IntFlag{Name: "threads", Usage: "onnxruntime intra-op threads (0: one per core)"},
	}
}

// sessionOptions reads sessionFlags; tok encodes text for the export (nil: none).
func sessionOptions(c *cli.Context, tok runtime.Tokenizer) runtime.Options {
	return runtime.Options{Provider: c.String("provider"), Threads: c.Int("threads"), Tokenizer: tok}
}
