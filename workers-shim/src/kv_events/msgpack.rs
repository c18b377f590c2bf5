//! The subset of MessagePack the KV-event formats use, read from a byte slice without
//! allocating or panicking (every read is bounds-checked and returns an error), and
//! written into a `Vec<u8>`.

/// Bytes that are not the MessagePack we expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgpackError {
    #[error("unexpected end of input")]
    Eof,
    #[error("expected {expected}, found marker {marker:#04x}")]
    Unexpected { expected: &'static str, marker: u8 },
}

/// One decoded scalar, or the header of a container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// Any integer; `negative` ones came as signed encodings.
    Int(Int),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    /// Extension types are skipped whole.
    Ext,
}

/// An integer as encoded: unsigned, or signed and negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    U(u64),
    I(i64),
}

impl Int {
    /// The value's bits as u64: negative i64 hashes (SGLang) keep their bit pattern.
    pub fn as_u64_bits(self) -> u64 {
        match self {
            Int::U(u) => u,
            Int::I(i) => i as u64,
        }
    }

    /// The value as i64 if it fits.
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Int::U(u) => i64::try_from(u).ok(),
            Int::I(i) => Some(i),
        }
    }
}

/// A cursor over MessagePack bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        if self.buf.len() < n {
            return Err(MsgpackError::Eof);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, MsgpackError> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Result<u64, MsgpackError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, MsgpackError> {
        let len = self.be(n)? as usize;
        // A length can never exceed what is left; refuse before anyone allocates for it.
        if len > self.buf.len() {
            return Err(MsgpackError::Eof);
        }
        Ok(len)
    }

    fn str(&mut self, len: usize, marker: u8) -> Result<Value<'a>, MsgpackError> {
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(Value::Str)
            .map_err(|_| MsgpackError::Unexpected {
                expected: "UTF-8 string",
                marker,
            })
    }

    /// Reads the next value (a container yields only its header).
    pub fn value(&mut self) -> Result<Value<'a>, MsgpackError> {
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => Value::Int(Int::U(u64::from(m))),
            0x80..=0x8f => Value::Map(usize::from(m & 0x0f)),
            0x90..=0x9f => Value::Array(usize::from(m & 0x0f)),
            0xa0..=0xbf => return self.str(usize::from(m & 0x1f), m),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (m - 0xc4))?;
                Value::Bin(self.take(n)?)
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (m - 0xc7))?;
                self.take(n + 1)?;
                Value::Ext
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => Value::Int(Int::U(self.be(1 << (m - 0xcc))?)),
            0xd0 => Value::Int(Int::I(i64::from(self.byte()? as i8))),
            0xd1 => Value::Int(Int::I(i64::from(self.be(2)? as u16 as i16))),
            0xd2 => Value::Int(Int::I(i64::from(self.be(4)? as u32 as i32))),
            0xd3 => Value::Int(Int::I(self.be(8)? as i64)),
            0xd4..=0xd8 => {
                self.take(1 + (1 << (m - 0xd4)))?;
                Value::Ext
            }
            0xd9..=0xdb => {
                let n = self.len(1 << (m - 0xd9))?;
                return self.str(n, m);
            }
            0xdc | 0xdd => Value::Array(self.len(2 << (m - 0xdc))?),
            0xde | 0xdf => Value::Map(self.len(2 << (m - 0xde))?),
            0xe0..=0xff => Value::Int(Int::I(i64::from(m as i8))),
            0xc1 => {
                return Err(MsgpackError::Unexpected {
                    expected: "a value",
                    marker: m,
                })
            }
        })
    }

    /// Skips one whole value, containers included (iteratively: deep nesting cannot
    /// overflow the stack, and lengths are bounded by the input).
    /// Whether the next value is nil (without reading it).
    pub fn peek_nil(&self) -> bool {
        self.buf.first() == Some(&0xc0)
    }

    /// The bytes of the next value, skipped.
    pub fn raw(&mut self) -> Result<&'a [u8], MsgpackError> {
        let before = self.buf;
        self.skip()?;
        Ok(&before[..before.len() - self.buf.len()])
    }

    pub fn skip(&mut self) -> Result<(), MsgpackError> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            match self.value()? {
                Value::Array(n) => pending += n,
                Value::Map(n) => pending += 2 * n,
                _ => {}
            }
        }
        Ok(())
    }

    /// Reads an integer (or nil as `None`).
    pub fn opt_int(&mut self) -> Result<Option<Int>, MsgpackError> {
        match self.value()? {
            Value::Nil => Ok(None),
            Value::Int(i) => Ok(Some(i)),
            other => Err(unexpected("an integer or nil", other)),
        }
    }

    /// Reads a string or nil; any other value is skipped and read as `None` (producers put
    /// metadata maps in string slots: SGLang's salted BlockStored).
    pub fn lenient_str(&mut self) -> Result<Option<&'a str>, MsgpackError> {
        let before = self.clone();
        match self.value()? {
            Value::Str(s) => Ok(Some(s)),
            Value::Array(_) | Value::Map(_) => {
                *self = before;
                self.skip()?;
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Reads an array header.
    pub fn array(&mut self) -> Result<usize, MsgpackError> {
        match self.value()? {
            Value::Array(n) => Ok(n),
            other => Err(unexpected("an array", other)),
        }
    }
}

fn unexpected(expected: &'static str, found: Value<'_>) -> MsgpackError {
    let marker = match found {
        Value::Nil => 0xc0,
        Value::Bool(_) => 0xc2,
        Value::Int(_) => 0xcf,
        Value::Float(_) => 0xcb,
        Value::Str(_) => 0xd9,
        Value::Bin(_) => 0xc4,
        Value::Array(_) => 0xdc,
        Value::Map(_) => 0xde,
        Value::Ext => 0xc7,
    };
    MsgpackError::Unexpected { expected, marker }
}

/// Appends MessagePack encodings to a buffer (the smallest encoding, as msgspec writes).
#[derive(Debug, Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    pub fn uint(&mut self, v: u64) {
        match v {
            0..=0x7f => self.buf.push(v as u8),
            0x80..=0xff => self.buf.extend_from_slice(&[0xcc, v as u8]),
            0x100..=0xffff => {
                self.buf.push(0xcd);
                self.buf.extend_from_slice(&(v as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                self.buf.push(0xce);
                self.buf.extend_from_slice(&(v as u32).to_be_bytes());
            }
            _ => {
                self.buf.push(0xcf);
                self.buf.extend_from_slice(&v.to_be_bytes());
            }
        }
    }

    pub fn float(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    pub fn str(&mut self, s: &str) {
        let n = s.len();
        match n {
            0..=31 => self.buf.push(0xa0 | n as u8),
            32..=0xff => self.buf.extend_from_slice(&[0xd9, n as u8]),
            0x100..=0xffff => {
                self.buf.push(0xda);
                self.buf.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.buf.push(0xdb);
                self.buf.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn header(&mut self, n: usize, fix: u8, m16: u8) {
        match n {
            0..=15 => self.buf.push(fix | n as u8),
            16..=0xffff => {
                self.buf.push(m16);
                self.buf.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.buf.push(m16 + 1);
                self.buf.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
    }

    pub fn array(&mut self, n: usize) {
        self.header(n, 0x90, 0xdc);
    }

    pub fn map(&mut self, n: usize) {
        self.header(n, 0x80, 0xde);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_width() {
        let mut w = Writer::default();
        w.array(6);
        for v in [5u64, 200, 60_000, 4_000_000_000, u64::MAX] {
            w.uint(v);
        }
        w.str(&"x".repeat(40));
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.array().unwrap(), 6);
        for v in [5u64, 200, 60_000, 4_000_000_000, u64::MAX] {
            assert_eq!(r.value().unwrap(), Value::Int(Int::U(v)));
        }
        assert_eq!(r.value().unwrap(), Value::Str(&"x".repeat(40)));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn signed_hashes_keep_their_bits() {
        // d3 = int64 -1
        let mut r = Reader::new(&[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r.opt_int().unwrap().unwrap().as_u64_bits(), u64::MAX);
    }

    #[test]
    fn truncated_and_hostile_input_errors_instead_of_panicking() {
        for bytes in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..], // array of 4 billion, no body
            &[0xdb, 0x00, 0x00, 0x10, 0x00, b'a'],
            &[0xcf, 1, 2],
            &[0xc1],
            &[],
        ] {
            let mut r = Reader::new(bytes);
            assert!(r.skip().is_err(), "{bytes:?}");
        }
    }
}
