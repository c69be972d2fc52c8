//! Telling, from the bytes a peer sends, when its handshake is over: the point after which a
//! connection is judged by its silences rather than by its handshake deadline.

/// How far a connection's handshake has come, read from the bytes its peer sent.
#[derive(Debug)]
pub(super) enum Handshake {
    /// Plaintext HTTP/2: this many bytes of the client preface still to come.
    Preface(usize),
    /// TLS: walking the client's records until a whole application-data record has arrived.
    Tls {
        header: [u8; 5],
        header_len: usize,
        /// Body bytes of the current record still to come, and its content type.
        body_left: usize,
        content_type: u8,
    },
    Done,
}

/// What an HTTP/2 client sends first, before any frame.
pub(super) const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// TLS's content type for application data: under TLS 1.3 the client's Finished already goes
/// out as one, under TLS 1.2 its first data after the handshake.
const APPLICATION_DATA: u8 = 23;

impl Handshake {
    pub(super) fn new(tls: bool) -> Self {
        if tls {
            Handshake::Tls {
                header: [0; 5],
                header_len: 0,
                body_left: 0,
                content_type: 0,
            }
        } else {
            Handshake::Preface(HTTP2_PREFACE.len())
        }
    }

    /// Takes in bytes the peer sent.
    pub(super) fn read(&mut self, mut data: &[u8]) {
        loop {
            match self {
                Handshake::Done => return,
                Handshake::Preface(left) => {
                    *left = left.saturating_sub(data.len());
                    if *left == 0 {
                        *self = Handshake::Done;
                    }
                    return;
                }
                Handshake::Tls { .. } if data.is_empty() => return,
                Handshake::Tls {
                    header,
                    header_len,
                    body_left,
                    content_type,
                } => {
                    let taken = if *body_left > 0 {
                        let take = (*body_left).min(data.len());
                        *body_left -= take;
                        take
                    } else {
                        take_header_byte(header, header_len, body_left, content_type, data[0]);
                        1
                    };
                    data = &data[taken..];
                    if *header_len == 0 && *body_left == 0 && *content_type == APPLICATION_DATA {
                        *self = Handshake::Done;
                    }
                }
            }
        }
    }

    pub(super) fn done(&self) -> bool {
        matches!(self, Handshake::Done)
    }
}

/// One byte of a record header; once the header is whole, the record's content type and its
/// body's length are known and the next header starts from scratch.
fn take_header_byte(
    header: &mut [u8; 5],
    header_len: &mut usize,
    body_left: &mut usize,
    content_type: &mut u8,
    byte: u8,
) {
    header[*header_len] = byte;
    *header_len += 1;
    if *header_len == header.len() {
        *header_len = 0;
        *content_type = header[0];
        *body_left = usize::from(u16::from_be_bytes([header[3], header[4]]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_handshake_ends_with_the_first_whole_application_data_record() {
        let mut handshake = Handshake::new(true);
        // A ClientHello record (type 22) of 3 bytes, split anyhow.
        handshake.read(&[22, 3, 1]);
        handshake.read(&[0, 3, 1]);
        handshake.read(&[2, 3]);
        assert!(!handshake.done());
        // A change-cipher-spec record, then the header of an application-data record.
        handshake.read(&[20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 4]);
        assert!(!handshake.done(), "a record header alone is not a finished handshake");
        handshake.read(&[9, 9, 9]);
        assert!(!handshake.done());
        handshake.read(&[9, 99, 99]);
        assert!(handshake.done());
        let mut plain = Handshake::new(false);
        plain.read(&HTTP2_PREFACE[..23]);
        assert!(!plain.done());
        plain.read(&HTTP2_PREFACE[23..]);
        assert!(plain.done());
    }
}
