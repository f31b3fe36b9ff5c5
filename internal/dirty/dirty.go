// Package dirty fills structs with non-zero values, for tests of code that
// sets a struct field by field: after it, a field it forgot still holds
// what Fill put there.
package dirty

import "reflect"

// Fill sets every exported field of the struct p points to (nested structs
// too) to a non-zero value: numbers to 7, bools to true, strings and byte
// slices to "stale".
func Fill(p any) {
	fill(reflect.ValueOf(p).Elem())
}

func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.String:
		v.SetString("stale")
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.Uint8 {
			// Left nil, a forgotten field of this kind would go unseen.
			panic("dirty: cannot fill a slice of " + v.Type().Elem().Kind().String())
		}
		v.SetBytes([]byte("stale"))
	default:
		panic("dirty: cannot fill a " + v.Kind().String())
	}
}
