//! OpenAI's image content parts (`{"type": "image_url", "image_url": {"url": …}}`, the Responses
//! API's `{"type": "input_image", "image_url": …}`): the image's bytes from a `data:` URL. A
//! remote `http(s)` URL is refused: a server that fetches the URLs its clients name can be made to
//! reach hosts only it can reach (a cloud's metadata service, a LAN), so clients send the bytes.

use base64::Engine;
use serde_json::Value;

use crate::error::ApiError;

/// The bytes of the image part `p`, found at `field` (`messages[0].content[1]`).
pub(crate) fn image_part(field: &str, p: &Value) -> Result<Vec<u8>, ApiError> {
    let url = match p.get("image_url") {
        Some(Value::String(u)) => u.as_str(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(u)) => u.as_str(),
            _ => {
                return Err(ApiError::bad(
                    format!("{field}.image_url.url"),
                    "an image part needs 'image_url': {\"url\": \"data:image/png;base64,…\"}",
                ));
            }
        },
        _ => {
            return Err(ApiError::bad(
                format!("{field}.image_url"),
                "an image part needs 'image_url': {\"url\": \"data:image/png;base64,…\"}",
            ));
        }
    };
    data_url(url).map_err(|why| ApiError::bad(format!("{field}.image_url.url"), why))
}

/// The bytes a `data:[<media type>];base64,<data>` URL carries.
fn data_url(url: &str) -> Result<Vec<u8>, String> {
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("data") => {}
        Some("http" | "https") => {
            return Err(
                "remote image URLs are refused (a server fetching URLs its clients name can be \
                 made to reach hosts only it can reach): send the image as a data: URL \
                 (data:image/png;base64,…)"
                    .into(),
            );
        }
        _ => {
            return Err(format!(
                "an image URL must be a data: URL (data:image/png;base64,…), got {}",
                url.chars().take(32).collect::<String>()
            ));
        }
    }
    let (head, data) = url[5..]
        .split_once(',')
        .ok_or("a data: URL needs a ',' before its data")?;
    if !head
        .rsplit(';')
        .next()
        .is_some_and(|p| p.eq_ignore_ascii_case("base64"))
    {
        return Err("the data: URL must be base64 (data:image/png;base64,…)".into());
    }
    // Clients wrap long lines or leave padding off; both are still the same bytes.
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean.trim_end_matches('='))
        .or_else(|_| {
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(clean.trim_end_matches('='))
        })
        .map_err(|e| format!("the data: URL's base64 does not decode: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_data_url_gives_its_bytes_in_either_shape_of_the_part() {
        let url = "data:image/png;base64,iVBORw0KGgo=";
        let want = b"\x89PNG\r\n\x1a\n".to_vec();
        let object = json!({"type": "image_url", "image_url": {"url": url, "detail": "auto"}});
        let string = json!({"type": "input_image", "image_url": url});
        assert_eq!(image_part("m", &object).expect("object"), want);
        assert_eq!(image_part("m", &string).expect("string"), want);
        let unpadded = json!({"image_url": "data:image/png;base64,iVBORw0KGgo"});
        assert_eq!(image_part("m", &unpadded).expect("unpadded"), want);
    }

    #[test]
    fn remote_urls_and_other_shapes_are_refused_by_name() {
        let remote = json!({"image_url": {"url": "https://169.254.169.254/latest"}});
        let e = image_part("messages[0].content[1]", &remote).expect_err("remote");
        assert!(e.message.contains("remote image URLs are refused"), "{e:?}");
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].content[1].image_url.url")
        );
        let plain = json!({"image_url": "data:text/plain,hello"});
        let e = image_part("m", &plain).expect_err("not base64");
        assert!(e.message.contains("must be base64"), "{e:?}");
        let e = image_part("m", &json!({"type": "image_url"})).expect_err("no url");
        assert!(e.message.contains("needs 'image_url'"), "{e:?}");
    }
}
