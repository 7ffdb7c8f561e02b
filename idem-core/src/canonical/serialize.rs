//! A `Serialize` value to JSON, through [`Checked`], a serializer wrapper
//! that forwards everything to `serde_json`'s own serializers but the
//! values it has no form for: see [values JSON has no form
//! for](super#values-json-has-no-form-for).

use std::cell::Cell;

use serde::ser::{
    self, Serialize, SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant,
    SerializeTuple, SerializeTupleStruct, SerializeTupleVariant, Serializer,
};
use serde_json::Value;

/// What the wrapper does with the values `serde_json` has no form for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Floats {
    /// For a writer: fails on a non-finite float, and notes that it did.
    Refuse,
    /// For a `Value`: fails on a non-finite float or an integer beyond 64
    /// bits, and notes that it did.
    Plain,
    /// For a `Value`: writes NaN, +inf and -inf as the strings `"\0NaN"`,
    /// `"\0inf"` and `"\0-inf"`, an integer beyond 64 bits as `"\0int:"`
    /// and its decimal digits, and every string (or char) that starts with
    /// NUL with one more NUL in front, so that no string is written as a
    /// mark.
    Mark,
}

/// The message of the error [`Floats::Refuse`] fails with.
pub(crate) const NON_FINITE: &str =
    "a non-finite float (NaN, inf or -inf) has no JSON form: serde_json would write it as null";

/// `value`'s JSON bytes as `serde_json::to_vec` writes them, or an error
/// when it holds a non-finite float.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let seen = Cell::new(false);
    serde_json::to_vec(&Checked::new(value, Floats::Refuse, &seen))
}

/// `value`'s JSON value as `serde_json::to_value` builds it, and `false`;
/// or, when it holds a non-finite float or an integer beyond 64 bits, its
/// marked form (see [`Floats::Mark`]) and `true`. The marked form of one
/// value can equal the plain form of another (`"\0NaN"`): a caller hashes
/// the two kinds apart.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<(Value, bool), serde_json::Error> {
    plain_or_marked(|floats, seen| serde_json::to_value(Checked::new(value, floats, seen)))
}

/// What `build` makes with [`Floats::Plain`], and `false`; or, when that
/// met a value to mark, what it makes with [`Floats::Mark`], and `true`:
/// one form for the whole of what is fingerprinted.
pub fn plain_or_marked<T>(
    build: impl Fn(Floats, &Cell<bool>) -> Result<T, serde_json::Error>,
) -> Result<(T, bool), serde_json::Error> {
    let seen = Cell::new(false);
    let plain = build(Floats::Plain, &seen);
    // A `Serialize` implementation could swallow the refusal and go on:
    // what was seen decides, not the result.
    if !seen.get() {
        return plain.map(|plain| (plain, false));
    }
    Ok((build(Floats::Mark, &seen)?, true))
}

/// A value serialized through the wrapper.
pub struct Checked<'a, T: ?Sized> {
    value: &'a T,
    floats: Floats,
    seen: &'a Cell<bool>,
}

impl<'a, T: ?Sized> Checked<'a, T> {
    /// `value`, serialized with `floats`; `seen` is set when a value
    /// without a plain form was met.
    pub fn new(value: &'a T, floats: Floats, seen: &'a Cell<bool>) -> Self {
        Checked {
            value,
            floats,
            seen,
        }
    }
}

impl<T: Serialize + ?Sized> Serialize for Checked<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(Wrap {
            inner: serializer,
            floats: self.floats,
            seen: self.seen,
        })
    }
}

struct Wrap<'a, S> {
    inner: S,
    floats: Floats,
    seen: &'a Cell<bool>,
}

impl<'a, S> Wrap<'a, S> {
    fn checked<'v, T: ?Sized>(&self, value: &'v T) -> Checked<'v, T>
    where
        'a: 'v,
    {
        Checked::new(value, self.floats, self.seen)
    }

    fn compound<C>(&self, inner: C) -> Compound<'a, C> {
        Compound {
            inner,
            floats: self.floats,
            seen: self.seen,
        }
    }
}

impl<S: Serializer> Wrap<'_, S> {
    fn non_finite(
        self,
        value: f64,
        finite: impl FnOnce(S) -> Result<S::Ok, S::Error>,
    ) -> Result<S::Ok, S::Error> {
        if value.is_finite() {
            return finite(self.inner);
        }
        self.seen.set(true);
        match self.floats {
            Floats::Refuse | Floats::Plain => Err(ser::Error::custom(NON_FINITE)),
            Floats::Mark => self.inner.serialize_str(if value.is_nan() {
                "\0NaN"
            } else if value > 0.0 {
                "\0inf"
            } else {
                "\0-inf"
            }),
        }
    }
}

impl<S: Serializer> Wrap<'_, S> {
    /// An integer beyond 64 bits, for a `Value`, which has no form for it.
    fn wide(self, v: impl std::fmt::Display) -> Result<S::Ok, S::Error> {
        self.seen.set(true);
        match self.floats {
            Floats::Mark => self.inner.serialize_str(&format!("\0int:{v}")),
            Floats::Refuse | Floats::Plain => Err(ser::Error::custom(WIDE)),
        }
    }
}

/// The message of the error [`Floats::Plain`] fails with on an integer
/// beyond 64 bits.
const WIDE: &str = "an integer beyond 64 bits has no serde_json value";

/// Forwards each named method to the wrapped serializer unchanged.
macro_rules! forward {
    ($($method:ident($ty:ty);)*) => {
        $(
            fn $method(self, v: $ty) -> Result<S::Ok, S::Error> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'a, S: Serializer> Serializer for Wrap<'a, S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Compound<'a, S::SerializeSeq>;
    type SerializeTuple = Compound<'a, S::SerializeTuple>;
    type SerializeTupleStruct = Compound<'a, S::SerializeTupleStruct>;
    type SerializeTupleVariant = Compound<'a, S::SerializeTupleVariant>;
    type SerializeMap = Compound<'a, S::SerializeMap>;
    type SerializeStruct = Compound<'a, S::SerializeStruct>;
    type SerializeStructVariant = Compound<'a, S::SerializeStructVariant>;

    forward! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_bytes(&[u8]);
        serialize_unit_struct(&'static str);
    }

    fn serialize_i128(self, v: i128) -> Result<S::Ok, S::Error> {
        // A writer writes it; so does a `Value` within 64 bits.
        if self.floats == Floats::Refuse || i64::try_from(v).is_ok() || u64::try_from(v).is_ok() {
            return self.inner.serialize_i128(v);
        }
        self.wide(v)
    }

    fn serialize_u128(self, v: u128) -> Result<S::Ok, S::Error> {
        if self.floats == Floats::Refuse || u64::try_from(v).is_ok() {
            return self.inner.serialize_u128(v);
        }
        self.wide(v)
    }

    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        self.non_finite(f64::from(v), |inner| inner.serialize_f32(v))
    }

    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        self.non_finite(v, |inner| inner.serialize_f64(v))
    }

    fn serialize_char(self, v: char) -> Result<S::Ok, S::Error> {
        if self.floats == Floats::Mark && v == '\0' {
            return self.inner.serialize_str("\0\0");
        }
        self.inner.serialize_char(v)
    }

    fn serialize_str(self, v: &str) -> Result<S::Ok, S::Error> {
        if self.floats == Floats::Mark && v.starts_with('\0') {
            return self.inner.serialize_str(&format!("\0{v}"));
        }
        self.inner.serialize_str(v)
    }

    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_none()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        let value = self.checked(value);
        self.inner.serialize_some(&value)
    }

    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<S::Ok, S::Error> {
        self.inner.serialize_unit_variant(name, index, variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        let value = self.checked(value);
        self.inner.serialize_newtype_struct(name, &value)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        let value = self.checked(value);
        self.inner
            .serialize_newtype_variant(name, index, variant, &value)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(self.inner.serialize_seq(len)?))
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(self.inner.serialize_tuple(len)?))
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(self.inner.serialize_tuple_struct(name, len)?))
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(
            self.inner
                .serialize_tuple_variant(name, index, variant, len)?,
        ))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(self.inner.serialize_map(len)?))
    }

    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(self.inner.serialize_struct(name, len)?))
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        let wrap = self.compound(());
        Ok(wrap.with(
            self.inner
                .serialize_struct_variant(name, index, variant, len)?,
        ))
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// A sequence, tuple, map or struct being serialized: each element goes
/// through the wrapper too.
struct Compound<'a, C> {
    inner: C,
    floats: Floats,
    seen: &'a Cell<bool>,
}

impl<'a, C> Compound<'a, C> {
    fn with<D>(self, inner: D) -> Compound<'a, D> {
        Compound {
            inner,
            floats: self.floats,
            seen: self.seen,
        }
    }

    fn checked<'v, T: ?Sized>(&self, value: &'v T) -> Checked<'v, T>
    where
        'a: 'v,
    {
        Checked::new(value, self.floats, self.seen)
    }
}

/// Implements a compound trait whose elements are serialized by `$method`
/// (with a leading `&'static str` or not) and which ends with `end`.
macro_rules! compound {
    ($trait:ident, $method:ident) => {
        impl<C: $trait> $trait for Compound<'_, C> {
            type Ok = C::Ok;
            type Error = C::Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
                let value = self.checked(value);
                self.inner.$method(&value)
            }

            fn end(self) -> Result<C::Ok, C::Error> {
                self.inner.end()
            }
        }
    };
    ($trait:ident, $method:ident, named) => {
        impl<C: $trait> $trait for Compound<'_, C> {
            type Ok = C::Ok;
            type Error = C::Error;

            fn $method<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), C::Error> {
                let value = self.checked(value);
                self.inner.$method(key, &value)
            }

            fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
                self.inner.skip_field(key)
            }

            fn end(self) -> Result<C::Ok, C::Error> {
                self.inner.end()
            }
        }
    };
}

compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);
compound!(SerializeStruct, serialize_field, named);
compound!(SerializeStructVariant, serialize_field, named);

impl<C: SerializeMap> SerializeMap for Compound<'_, C> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), C::Error> {
        let key = self.checked(key);
        self.inner.serialize_key(&key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let value = self.checked(value);
        self.inner.serialize_value(&value)
    }

    fn serialize_entry<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), C::Error> {
        let (key, value) = (self.checked(key), self.checked(value));
        self.inner.serialize_entry(&key, &value)
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        self.inner.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use serde::Serialize;
    use serde_json::json;
    use std::collections::{BTreeMap, HashMap};

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(f64),
        Tuple(u8, f32),
        Struct { r: f64, tag: char },
    }

    #[derive(Serialize)]
    struct Unit;

    #[derive(Serialize)]
    struct Wrapper(String);

    #[derive(Serialize)]
    struct Pair(i64, Option<u32>);

    #[derive(Serialize)]
    struct Order {
        id: u128,
        neg: i128,
        amount: f64,
        ratio: f32,
        #[serde(skip_serializing_if = "Option::is_none")]
        memo: Option<String>,
        #[serde(with = "serde_bytes_like")]
        raw: Vec<u8>,
        shapes: Vec<Shape>,
        by_id: BTreeMap<u64, Pair>,
        flags: HashMap<bool, Unit>,
        name: Wrapper,
        #[serde(flatten)]
        extra: BTreeMap<String, serde_json::Value>,
        raw_json: Box<serde_json::value::RawValue>,
    }

    mod serde_bytes_like {
        pub(super) fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    fn order() -> Order {
        Order {
            id: u128::from(u64::MAX),
            neg: -5,
            amount: 12.5,
            ratio: 0.1,
            memo: None,
            raw: vec![0, 255],
            shapes: vec![
                Shape::Unit,
                Shape::Newtype(-0.0),
                Shape::Tuple(7, 1e-3),
                Shape::Struct {
                    r: 1e300,
                    tag: '\0',
                },
            ],
            by_id: BTreeMap::from([(3, Pair(-1, None)), (1, Pair(2, Some(9)))]),
            flags: HashMap::from([(true, Unit)]),
            name: Wrapper("\0 and \u{1F600}".into()),
            extra: BTreeMap::from([("z".into(), json!({"b": [1.5, null], "a": "x"}))]),
            raw_json: serde_json::value::RawValue::from_string(r#"{"q": 1, "p": [2]}"#.into())
                .unwrap(),
        }
    }

    /// Values without a non-finite float get exactly serde_json's forms, so
    /// that no stored fingerprint or outcome changes.
    #[test]
    fn finite_values_keep_serde_jsons_forms() {
        let order = order();
        assert_eq!(to_vec(&order).unwrap(), serde_json::to_vec(&order).unwrap());
        assert_eq!(
            to_value(&order).unwrap(),
            (serde_json::to_value(&order).unwrap(), false)
        );
        for value in [json!(null), json!("\0NaN"), json!([1, "a", {"k": -2.25}])] {
            assert_eq!(to_vec(&value).unwrap(), serde_json::to_vec(&value).unwrap());
            assert_eq!(to_value(&value).unwrap(), (value.clone(), false));
        }
        // And so the canonical text, as before this wrapper.
        let mut before = Vec::new();
        crate::canonical::write_text(&serde_json::to_value(&order).unwrap(), false, &mut before)
            .unwrap();
        assert_eq!(
            Fingerprint::canonical_json(&order).unwrap().as_bytes(),
            before
        );
    }

    #[test]
    fn outcomes_refuse_non_finite_floats_at_any_depth() {
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = to_vec(&value).unwrap_err();
            assert!(err.to_string().contains("non-finite"), "{err}");
            assert!(to_vec(&vec![Some(Shape::Newtype(value))]).is_err());
            assert!(to_vec(&Shape::Struct { r: value, tag: 'a' }).is_err());
        }
        assert!(to_vec(&Shape::Tuple(1, f32::NAN)).is_err());
        assert!(to_vec(&HashMap::from([("k", f32::INFINITY)])).is_err());
    }

    /// A map keyed by floats, which no derive writes.
    struct FloatKeys(Vec<(f64, u8)>);

    impl Serialize for FloatKeys {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(Some(self.0.len()))?;
            for (k, v) in &self.0 {
                map.serialize_entry(k, v)?;
            }
            map.end()
        }
    }

    /// Payloads that differ only in a non-finite float, or in a string
    /// spelled as a mark, get different fingerprints; equal ones equal.
    #[test]
    fn non_finite_floats_are_fingerprinted_apart() {
        let f = |v: &dyn erased::Fp| v.fp();
        let payloads: Vec<Box<dyn erased::Fp>> = vec![
            Box::new(json!([null])),
            Box::new([f64::NAN]),
            Box::new([f64::INFINITY]),
            Box::new([f64::NEG_INFINITY]),
            Box::new(["\0NaN"]),
            Box::new(["\0inf"]),
            Box::new(["\0\0NaN"]),
            Box::new((f64::NAN, "\0NaN")),
            Box::new((f64::NAN, f64::NAN)),
            Box::new((f64::NAN, "\0\0NaN")),
            Box::new((f64::NAN, '\0')),
            Box::new((f64::NAN, "\0")),
            Box::new((f64::NAN, "\0\0")),
            Box::new(Shape::Newtype(f64::INFINITY)),
            Box::new(Shape::Newtype(f64::NEG_INFINITY)),
            Box::new(FloatKeys(vec![(f64::NAN, 1)])),
            Box::new(FloatKeys(vec![(f64::INFINITY, 1)])),
        ];
        let prints: Vec<Fingerprint> = payloads.iter().map(|p| f(&**p)).collect();
        for (i, a) in prints.iter().enumerate() {
            for (j, b) in prints.iter().enumerate().skip(i + 1) {
                // A char and a one-char string have one JSON form, as before.
                let same = (i, j) == (10, 11);
                assert_eq!(a == b, same, "payloads {i} and {j}");
            }
        }
        // The same payload, the same fingerprint, whatever the map order.
        let a = HashMap::from([("x", f64::NAN), ("y", f64::INFINITY), ("z", 1.0)]);
        let b: BTreeMap<_, _> = a.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
        assert!(Fingerprint::canonical_json(&b)
            .unwrap()
            .starts_with("\0marked\0{\"x\":\"\\u0000NaN\",\"y\":\"\\u0000inf\",\"z\":1.0}"));
    }

    /// Integers beyond 64 bits: a writer writes them as numbers, as
    /// serde_json does; a fingerprint marks them, apart from every string
    /// and from the same digits as a float.
    #[test]
    fn wide_integers_are_written_and_fingerprinted() {
        assert_eq!(
            to_vec(&u128::MAX).unwrap(),
            serde_json::to_vec(&u128::MAX).unwrap()
        );
        assert_eq!(
            to_vec(&i128::MIN).unwrap(),
            serde_json::to_vec(&i128::MIN).unwrap()
        );
        let wei: u128 = 20_000_000_000_000_000_000;
        let (value, marked) = to_value(&(wei, "x")).unwrap();
        assert!(marked);
        assert_eq!(value, json!(["\0int:20000000000000000000", "x"]));
        // Within 64 bits, as before, and the same whatever the Rust type.
        assert_eq!(
            to_value(&u128::from(u64::MAX)).unwrap(),
            (json!(u64::MAX), false)
        );
        assert_eq!(
            to_value(&i128::from(i64::MIN)).unwrap(),
            (json!(i64::MIN), false)
        );
        let of = |v: &dyn erased::Fp| v.fp();
        let prints = [
            of(&wei),
            of(&(wei + 1)),
            of(&-(wei as i128)),
            of(&"\0int:20000000000000000000"),
            of(&2e19f64),
            of(&u128::MAX),
            of(&i128::MIN),
        ];
        for (i, a) in prints.iter().enumerate() {
            for b in &prints[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(of(&wei), of(&(wei as i128)));
        assert_eq!(of(&wei), Fingerprint::of(&wei).unwrap());
    }

    mod erased {
        use crate::fingerprint::Fingerprint;

        pub(super) trait Fp {
            fn fp(&self) -> Fingerprint;
        }

        impl<T: serde::Serialize> Fp for T {
            fn fp(&self) -> Fingerprint {
                Fingerprint::of(self).unwrap()
            }
        }
    }
}
