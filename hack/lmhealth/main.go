// lmhealth: the health verdicts GitOps tools give a LocalModel, from their own code.
//
// For every object read (JSON: one object, a List with items, or a stream of
// either) it prints one JSON line with
//   - kstatus: sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, the library Flux's
//     health checks (and `kubectl wait`-like tools built on cli-utils) use;
//   - lua (with -lua SCRIPT): an Argo CD resource health check run as Argo CD runs
//     one, in gopher-lua with the object as the global `obj`, returning a table
//     with `status` and `message`.
//
//	lmhealth [-lua SCRIPT] [FILE...]    no FILE, or "-": standard input
//
// Built and cached by hack/build-tools.sh (the module versions are pinned there).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type line struct {
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Name       string   `json:"name"`
	Generation int64    `json:"generation"`
	Kstatus    verdict  `json:"kstatus"`
	Lua        *verdict `json:"lua,omitempty"`
}

func main() {
	script := flag.String("lua", "", "an Argo CD health check (Lua) to run on every object too")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: lmhealth [-lua SCRIPT] [FILE...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	var source string
	if *script != "" {
		b, err := os.ReadFile(*script)
		if err != nil {
			fail("%v", err)
		}
		source = string(b)
	}
	files := flag.Args()
	if len(files) == 0 {
		files = []string{"-"}
	}
	out := json.NewEncoder(os.Stdout)
	for _, f := range files {
		objs, err := read(f)
		if err != nil {
			fail("%s: %v", f, err)
		}
		for _, u := range objs {
			l, err := judge(u, source)
			if err != nil {
				fail("%s: %s %s/%s: %v", f, u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
			if err := out.Encode(l); err != nil {
				fail("%v", err)
			}
		}
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lmhealth: "+format+"\n", args...)
	os.Exit(1)
}

// read decodes every object in a file: numbers as int64 where whole, as the
// API machinery does (kstatus reads generations with NestedInt64).
func read(path string) ([]*unstructured.Unstructured, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var objs []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, err
		}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, err
			}
			for i := range list.Items {
				objs = append(objs, &list.Items[i])
			}
			continue
		}
		objs = append(objs, u)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("no objects")
	}
	return objs, nil
}

func judge(u *unstructured.Unstructured, source string) (line, error) {
	l := line{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(),
		Generation: u.GetGeneration()}
	res, err := status.Compute(u)
	if err != nil {
		return l, fmt.Errorf("kstatus: %w", err)
	}
	l.Kstatus = verdict{Status: res.Status.String(), Message: res.Message}
	if source != "" {
		v, err := runLua(source, u.Object)
		if err != nil {
			return l, fmt.Errorf("lua: %w", err)
		}
		l.Lua = &v
	}
	return l, nil
}

// runLua runs a health check as Argo CD does: a fresh state with the standard
// libraries, the object as the global `obj`, the script's return value a table.
func runLua(source string, obj map[string]any) (verdict, error) {
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(source); err != nil {
		return verdict{}, err
	}
	ret := L.Get(-1)
	t, ok := ret.(*lua.LTable)
	if !ok {
		return verdict{}, fmt.Errorf("the script returned %s, not a table", ret.Type())
	}
	v := verdict{Status: lua.LVAsString(t.RawGetString("status")),
		Message: lua.LVAsString(t.RawGetString("message"))}
	switch v.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
		return v, nil
	}
	return verdict{}, fmt.Errorf("the script returned status %q, not an Argo CD health status", v.Status)
}

// toLua converts decoded JSON to Lua values: objects and arrays become tables
// (arrays indexed from 1), numbers LNumber, null nil.
func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case string:
		return lua.LString(x)
	case int64:
		return lua.LNumber(x)
	case float64:
		return lua.LNumber(x)
	case []any:
		t := L.NewTable()
		for _, item := range x {
			t.Append(toLua(L, item))
		}
		return t
	case map[string]any:
		t := L.NewTable()
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t.RawSetString(k, toLua(L, x[k]))
		}
		return t
	}
	return lua.LString(fmt.Sprint(v))
}
