// Command linearizability checks a history of list appends and reads, recorded by e2e/history.py
// through a Postgres instance's `-rw` Service during failovers, with porcupine.
//
// Input: one JSON operation per line on stdin. Output: "Ok", "Illegal" or "Unknown" and a
// summary; the exit code is 0 only for Ok.
//
// The model: every key is a set of numbers; an append adds one; a read returns them all
// (sorted). Keys are independent (one partition each). A set, not a list: an append of unknown
// outcome may take effect after a later one of the same client. An append whose outcome is unknown
// (its connection broke before the answer) may have taken effect at any moment after its call:
// its return is the end of time. One that no read ever saw is left out, which is sound (a
// history with it is linearizable if the one without it is: it may take effect after every
// read) and keeps the search small.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type recorded struct {
	Client int    `json:"client"`
	Key    string `json:"key"`
	Kind   string `json:"kind"` // "append" or "read"
	Value  int    `json:"value"`
	Values []int  `json:"values"`
	Call   int64  `json:"call"`
	Return *int64 `json:"return"` // null: outcome unknown
}

type input struct {
	read  bool
	value int
}

// A set as text, sorted ("1,2,3"): states compare with ==.
func render(values []int) string {
	sorted := append([]int(nil), values...)
	sort.Ints(sorted)
	parts := make([]string, len(sorted))
	for i, v := range sorted {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ",")
}

func parse(state string) []int {
	if state == "" {
		return nil
	}
	var values []int
	for _, part := range strings.Split(state, ",") {
		v, _ := strconv.Atoi(part)
		values = append(values, v)
	}
	return values
}

var model = porcupine.Model{
	Init: func() interface{} { return "" },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		list := state.(string)
		op := in.(input)
		if op.read {
			return out.(string) == list, list
		}
		return true, render(append(parse(list), op.value))
	},
	DescribeOperation: func(in, out interface{}) string {
		op := in.(input)
		if op.read {
			return fmt.Sprintf("read() -> [%s]", out.(string))
		}
		return fmt.Sprintf("append(%d)", op.value)
	},
}

// operations turns the records into porcupine's operations, one partition per key.
func operations(records []recorded) [][]porcupine.Operation {
	seen := map[string]map[int]bool{}
	for _, r := range records {
		if r.Kind == "read" {
			if seen[r.Key] == nil {
				seen[r.Key] = map[int]bool{}
			}
			for _, v := range r.Values {
				seen[r.Key][v] = true
			}
		}
	}
	byKey := map[string][]porcupine.Operation{}
	for _, r := range records {
		ret := int64(math.MaxInt64)
		if r.Return != nil {
			ret = *r.Return
		} else if r.Kind == "read" || !seen[r.Key][r.Value] {
			continue // a read without an answer says nothing; an unseen unknown append is left out
		}
		op := porcupine.Operation{ClientId: r.Client, Call: r.Call, Return: ret}
		if r.Kind == "read" {
			op.Input, op.Output = input{read: true}, render(r.Values)
		} else {
			op.Input, op.Output = input{value: r.Value}, ""
		}
		byKey[r.Key] = append(byKey[r.Key], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	partitions := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		partitions = append(partitions, byKey[k])
	}
	return partitions
}

func main() {
	timeout := 2 * time.Minute
	var records []recorded
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<26)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		var r recorded
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			fmt.Fprintf(os.Stderr, "bad record %q: %v\n", line, err)
			os.Exit(3)
		}
		records = append(records, r)
	}
	if err := scanner.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	partitions := operations(records)
	var history []porcupine.Operation
	for _, p := range partitions {
		history = append(history, p...)
	}
	keyed := model
	keyed.Partition = func([]porcupine.Operation) [][]porcupine.Operation { return partitions }
	started := time.Now()
	result := porcupine.CheckOperationsTimeout(keyed, history, timeout)
	fmt.Printf("%s: %d records, %d operations checked over %d keys in %.1f s\n",
		map[porcupine.CheckResult]string{porcupine.Ok: "Ok", porcupine.Illegal: "Illegal", porcupine.Unknown: "Unknown"}[result],
		len(records), len(history), len(partitions), time.Since(started).Seconds())
	if result != porcupine.Ok {
		os.Exit(1)
	}
}
